"""The README's main job: fuse, build and run the bundled detection-head model.

Prints the fusion plan, checks the outputs against onnxruntime when it is installed, and
times our build against TVM's FuseOps partition with the same schedules.
"""

from __future__ import annotations

import time
from pathlib import Path

import numpy as np
import onnx

import fusion_tvm

MODEL = Path(__file__).with_name("detection_head.onnx")


def _inputs(model: onnx.ModelProto, seed: int = 0) -> dict[str, np.ndarray]:
    rng = np.random.default_rng(seed)
    feeds = {}
    for inp in model.graph.input:
        dims = [d.dim_value or 1 for d in inp.type.tensor_type.shape.dim]
        feeds[inp.name] = rng.standard_normal(dims).astype("float32")
    return feeds


def _median_ms(cm, feeds, repeat=20) -> float:
    cm.run(feeds)
    times = []
    for _ in range(repeat):
        t0 = time.perf_counter()
        cm.run(feeds)
        times.append(time.perf_counter() - t0)
    return 1e3 * float(np.median(times))


def main() -> None:
    """Compile and run the example; print plan, accuracy and timings."""
    model = onnx.load(str(MODEL))
    feeds = _inputs(model)
    ours = fusion_tvm.compile(model)
    print(ours.plan.table())
    outputs = ours.run(feeds)
    try:
        import onnxruntime as ort

        ref = ort.InferenceSession(str(MODEL)).run(None, feeds)
        err = max(float(np.abs(a - b).max()) for a, b in zip(outputs, ref, strict=True))
        print(f"\nmax abs error vs onnxruntime: {err:.2e}")
    except ImportError:
        print("\nonnxruntime not installed: accuracy check skipped")
    fuseops = fusion_tvm.compile(model, fusion="fuseops")
    t_ours, t_fo = _median_ms(ours, feeds), _median_ms(fuseops, feeds)
    print(f"kernels: ours {ours.num_kernels}, FuseOps {fuseops.num_kernels}")
    print(f"measured: ours {t_ours:.3f} ms, FuseOps (same schedules) {t_fo:.3f} ms "
          f"-> {t_fo / t_ours:.2f}x")


if __name__ == "__main__":
    main()
