"""A plain multilayer perceptron: Gemm + Relu layers and a Softmax."""

from __future__ import annotations

from .builder import GraphBuilder, batch_dim


def mlp(batch: int = 1, sizes=(784, 512, 256, 10), dynamic: bool = False, seed: int = 0):
    """``Gemm(transB=1)`` + Relu per hidden layer (He init), Softmax on the logits."""
    g = GraphBuilder("mlp", seed)
    g.default_dims = {"N": batch} if dynamic else {}
    x = g.add_input("input", [batch_dim(batch, dynamic), sizes[0]])
    for i, (din, dout) in enumerate(zip(sizes[:-1], sizes[1:], strict=True)):
        last = i == len(sizes) - 2
        x = g.gemm(x, din, dout, gain=1.0 if last else 2.0)
        if not last:
            x = g.relu(x)
    g.op("Softmax", [x], name="probs", axis=-1)
    g.add_output("probs", None)
    return g.build(f"MLP {list(sizes)}")
