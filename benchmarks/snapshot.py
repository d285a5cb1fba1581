"""Fingerprints of what the compiler produces, to prove a refactor changed nothing.

For each model and target: the scheduled TIR (``mod.script()`` after the schedule phase,
before VM lowering) and the plan JSON (groups, predicted times; wall-clock fields dropped);
for the HLS target, every file of the exported project. Writes one JSON of sha256 hashes
(and, with ``--dump DIR``, the texts themselves) so two commits compare file by file::

    python benchmarks/snapshot.py --out /tmp/before.json --dump /tmp/before
    # ... change the code ...
    python benchmarks/snapshot.py --out /tmp/after.json --dump /tmp/after
    python benchmarks/snapshot.py --compare /tmp/before.json /tmp/after.json

Frozen hardware presets only (``epyc-znver4-2c`` for LLVM, ``h100`` for CUDA, ``u250`` for
HLS), so the figures do not depend on the machine.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import os
import sys
import tempfile
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from benchmarks import zoo  # noqa: E402

CPU_GPU_MODELS = ["mlp", "detection_head", "resnet18", "mobilenetv2", "bert_2l_s16", "gpt2_2l",
                  "vit_tiny"]
HLS_MODELS = ["mlp", "detection_head"]
PRESETS = {"llvm": "epyc-znver4-2c", "cuda": "h100", "hls": "u250"}
#: Plan fields measured in wall-clock time: they differ between two runs of one commit.
WALL_CLOCK = ("search_time_s",)


def _plan_text(plan) -> str:
    data = plan.to_json()
    for key in WALL_CLOCK:
        data.pop(key, None)
    data["notes"] = [n for n in data.get("notes", []) if not n.startswith("pass time")]
    return json.dumps(data, indent=1, sort_keys=True, default=str)


def _sha(text: str | bytes) -> str:
    raw = text.encode() if isinstance(text, str) else text
    return hashlib.sha256(raw).hexdigest()[:16]


def snapshot_cpu_gpu(name: str, target: str) -> dict[str, str]:
    """Scheduled TIR and plan JSON of one zoo model for ``target``."""
    from fusion_tvm import pipeline
    from fusion_tvm.frontend import load_model

    loaded = load_model(zoo.get_model(name))
    if hasattr(pipeline, "run_phases"):
        result = pipeline.run_phases(loaded.mod, pipeline.resolve(target, PRESETS[target]))
        mod, plan = result.mod, result.plan
    else:  # before the one phase runner (commit ff038aa and earlier)
        from fusion_tvm.api import fuse_and_schedule

        def make(config):
            return pipeline.make_pipeline(target=target, hw=PRESETS[target], config=config)

        parts, _fused, mod = fuse_and_schedule(loaded, make, None, True)
        plan = parts.fuse_pass.plan
    return {"tir": mod.script(), "plan": _plan_text(plan)}


def snapshot_hls(name: str) -> dict[str, str]:
    """Every file of the exported HLS project of one zoo model (small size)."""
    import fusion_tvm

    model = zoo.get_model(name, **zoo.small_kwargs(name))
    cm = fusion_tvm.compile(model, target="hls", hw=PRESETS["hls"])
    out = {"plan": _plan_text(cm.plan)}
    with tempfile.TemporaryDirectory() as tmp:
        cm.export(tmp)
        for path in sorted(Path(tmp).rglob("*")):
            if path.is_file():
                out[f"file:{path.relative_to(tmp)}"] = path.read_bytes().decode(errors="replace")
    return out


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--out", help="JSON of hashes to write")
    ap.add_argument("--dump", help="folder for the texts themselves")
    ap.add_argument("--models", nargs="*", default=CPU_GPU_MODELS)
    ap.add_argument("--targets", nargs="*", default=["llvm", "cuda", "hls"])
    ap.add_argument("--compare", nargs=2, metavar=("BEFORE", "AFTER"))
    args = ap.parse_args(argv)
    if args.compare:
        before, after = (json.loads(Path(p).read_text()) for p in args.compare)
        diff = sorted(k for k in set(before) | set(after) if before.get(k) != after.get(k))
        for k in diff:
            print(f"DIFFERS {k}: {before.get(k)} -> {after.get(k)}")
        print(f"{len(before)} fingerprints, {len(diff)} differ")
        return 1 if diff else 0
    hashes: dict[str, str] = {}
    for target in args.targets:
        names = HLS_MODELS if target == "hls" else args.models
        for name in names:
            texts = snapshot_hls(name) if target == "hls" else snapshot_cpu_gpu(name, target)
            for part, text in texts.items():
                key = f"{target}/{name}/{part}"
                hashes[key] = _sha(text)
                if args.dump:
                    dest = Path(args.dump) / target / name / part.replace(":", "_")
                    dest.parent.mkdir(parents=True, exist_ok=True)
                    dest.write_text(text)
                print(f"{key:60s} {hashes[key]}", flush=True)
    if args.out:
        os.makedirs(os.path.dirname(os.path.abspath(args.out)), exist_ok=True)
        Path(args.out).write_text(json.dumps(hashes, indent=1, sort_keys=True))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
