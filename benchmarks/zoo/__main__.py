"""``python -m benchmarks.zoo [--write-example] [--save DIR]``: list, save or regenerate models."""

from __future__ import annotations

import argparse
from pathlib import Path

import onnx

from . import get_model, get_spec, list_models
from .detection import write_example


def main(argv=None) -> None:
    ap = argparse.ArgumentParser(prog="python -m benchmarks.zoo", description=__doc__)
    ap.add_argument("--write-example", action="store_true",
                    help="regenerate fusion_tvm/examples/detection_head.onnx")
    ap.add_argument("--save", type=Path, help="write every preset (or --models) to DIR/<name>.onnx")
    ap.add_argument("--models", nargs="*", default=None)
    args = ap.parse_args(argv)
    if args.write_example:
        print(write_example())
    names = args.models or list_models()
    for name in names:
        spec = get_spec(name)
        line = f"{name:16s} {spec.family:12s} {spec.defaults}"
        if args.save:
            args.save.mkdir(parents=True, exist_ok=True)
            path = args.save / f"{name}.onnx"
            onnx.save(get_model(name), str(path))
            line += f"  -> {path}"
        print(line)


if __name__ == "__main__":
    main()
