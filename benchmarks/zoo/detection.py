"""A YOLO-style detection neck and head; also writes the bundled example model.

Regenerate the example with ``python -m benchmarks.zoo --write-example``; the file is
byte-identical for a given seed.
"""

from __future__ import annotations

from pathlib import Path

import onnx

from .builder import GraphBuilder, batch_dim

EXAMPLE_PATH = Path(__file__).resolve().parents[2] / "fusion_tvm" / "examples" / \
    "detection_head.onnx"


def detection_head(batch: int = 1, image: int = 64, width: int = 8, classes: int = 3,
                   anchors: int = 3, dynamic: bool = False, seed: int = 0):
    """A tiny backbone (stride 16), an FPN-style neck and two detection heads.

    Conv + BatchNormalization + SiLU (Sigmoid * Mul, as YOLOv5 exports it) everywhere; the neck
    upsamples with ``Resize`` (nearest, scale 2) and joins features with ``Concat``.
    Outputs raw head maps at strides 8 and 4: [N, anchors * (5 + classes), H, W].
    """
    g = GraphBuilder("detection_head", seed)
    g.default_dims = {"N": batch} if dynamic else {}
    x = g.add_input("images", [batch_dim(batch, dynamic), 3, image, image], kind="image")
    w = width

    def cbs(t, cin, cout, k=3, stride=1):
        return g.conv_bn(t, cin, cout, k, stride, act="silu")

    p1 = cbs(x, 3, w, 3, 2)                  # stride 2
    p2 = cbs(cbs(p1, w, 2 * w, 3, 2), 2 * w, 2 * w, 1)  # stride 4
    p3 = cbs(cbs(p2, 2 * w, 4 * w, 3, 2), 4 * w, 4 * w, 1)  # stride 8
    p4 = cbs(cbs(p3, 4 * w, 8 * w, 3, 2), 8 * w, 8 * w, 1)  # stride 16
    scales = g.const([1.0, 1.0, 2.0, 2.0], "upsample_scales")

    def up(t):
        return g.op("Resize", [t, "", scales], mode="nearest",
                    coordinate_transformation_mode="asymmetric", nearest_mode="floor")

    lat4 = cbs(p4, 8 * w, 4 * w, 1)
    n3 = cbs(g.op("Concat", [up(lat4), p3], axis=1), 8 * w, 4 * w, 3)
    lat3 = cbs(n3, 4 * w, 2 * w, 1)
    n2 = cbs(g.op("Concat", [up(lat3), p2], axis=1), 4 * w, 2 * w, 3)
    out_c = anchors * (5 + classes)
    for name, t, c in (("head_s8", n3, 4 * w), ("head_s4", n2, 2 * w)):
        h = g.conv(t, c, out_c, 1, bias=True, gain=1.0)
        g.op("Identity", [h], name=name)
        g.add_output(name, None)
    return g.build(f"YOLO-style neck + heads, width {width}, image {image}")


def write_example(path: Path = EXAMPLE_PATH) -> Path:
    """Save the bundled example (batch 1, 3x64x64) to ``path``."""
    path.parent.mkdir(parents=True, exist_ok=True)
    onnx.save(detection_head(), str(path))
    return path
