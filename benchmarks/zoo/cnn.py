"""Convolutional classifiers: ResNet-18/50 and MobileNetV2, node for node as torchvision exports.

Conv and BatchNormalization stay separate nodes (an export without BN folding), so the fusion
search sees Conv -> BN -> Relu chains and the residual Add.
"""

from __future__ import annotations

import numpy as np

from .builder import GraphBuilder, batch_dim


def _image_input(g: GraphBuilder, batch: int, image: int, dynamic: bool) -> str:
    g.default_dims = {"N": batch} if dynamic else {}
    return g.add_input("input", [batch_dim(batch, dynamic), 3, image, image], kind="image")


def _classifier(g: GraphBuilder, x: str, channels: int, classes: int) -> None:
    pooled = g.op("Flatten", [g.op("GlobalAveragePool", [x])], axis=1)
    g.op("Gemm", [pooled, g.normal((classes, channels), np.sqrt(1.0 / channels), "fc.weight"),
                  g.const(np.zeros(classes), "fc.bias")], name="logits", transB=1)
    g.add_output("logits", None)


def resnet(depth: int = 18, batch: int = 1, image: int = 224, width: int = 64,
           classes: int = 1000, dynamic: bool = False, seed: int = 0):
    """ResNet-18 (basic blocks) or ResNet-50 (bottlenecks); ``width`` scales every stage."""
    blocks = {18: [2, 2, 2, 2], 34: [3, 4, 6, 3], 50: [3, 4, 6, 3]}[depth]
    bottleneck = depth >= 50
    expansion = 4 if bottleneck else 1
    g = GraphBuilder(f"resnet{depth}", seed)
    x = _image_input(g, batch, image, dynamic)
    x = g.conv_bn(x, 3, width, 7, stride=2)
    x = g.op("MaxPool", [x], kernel_shape=[3, 3], strides=[2, 2], pads=[1, 1, 1, 1])
    cin = width
    for stage, n in enumerate(blocks):
        planes = width * 2**stage
        for i in range(n):
            stride = 2 if stage > 0 and i == 0 else 1
            cout = planes * expansion
            # The last BN of each branch gets a small gamma (like zero-init-residual, but not
            # degenerate) so the residual stream does not blow up with depth.
            if bottleneck:
                y = g.conv_bn(x, cin, planes, 1)
                y = g.conv_bn(y, planes, planes, 3, stride=stride)
                y = g.conv_bn(y, planes, cout, 1, act=None, gamma=0.3)
            else:
                y = g.conv_bn(x, cin, planes, 3, stride=stride)
                y = g.conv_bn(y, planes, cout, 3, act=None, gamma=0.3)
            if stride != 1 or cin != cout:
                x = g.conv_bn(x, cin, cout, 1, stride=stride, act=None)
            x = g.relu(g.op("Add", [y, x]))
            cin = cout
    _classifier(g, x, cin, classes)
    return g.build(f"ResNet-{depth}, width {width}, image {image}")


def mobilenet_v2(batch: int = 1, image: int = 224, width_mult: float = 1.0, classes: int = 1000,
                 dynamic: bool = False, seed: int = 0):
    """MobileNetV2: inverted residuals with depthwise conv (group=C) and ReLU6 as Clip."""

    def ch(c: float) -> int:  # torchvision's _make_divisible(c, 8)
        v = max(8, int(c + 4) // 8 * 8)
        return v + 8 if v < 0.9 * c else v

    settings = [(1, 16, 1, 1), (6, 24, 2, 2), (6, 32, 3, 2), (6, 64, 4, 2), (6, 96, 3, 1),
                (6, 160, 3, 2), (6, 320, 1, 1)]
    g = GraphBuilder("mobilenet_v2", seed)
    x = _image_input(g, batch, image, dynamic)
    cin = ch(32 * width_mult)
    x = g.conv_bn(x, 3, cin, 3, stride=2, act="relu6")
    for t, c, n, s in settings:
        cout = ch(c * width_mult)
        for i in range(n):
            stride = s if i == 0 else 1
            hidden = cin * t
            y = x
            if t != 1:
                y = g.conv_bn(y, cin, hidden, 1, act="relu6")
            y = g.conv_bn(y, hidden, hidden, 3, stride=stride, group=hidden, act="relu6")
            use_res = stride == 1 and cin == cout
            y = g.conv_bn(y, hidden, cout, 1, act=None, gamma=0.3 if use_res else 1.0)
            x = g.op("Add", [x, y]) if use_res else y
            cin = cout
    last = ch(1280 * max(1.0, width_mult))
    x = g.conv_bn(x, cin, last, 1, act="relu6")
    _classifier(g, x, last, classes)
    return g.build(f"MobileNetV2 x{width_mult}, image {image}")
