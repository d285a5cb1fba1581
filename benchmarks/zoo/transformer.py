"""Transformer models: a BERT-style encoder, a GPT-2-style causal decoder and ViT.

The graphs follow what ``torch.onnx.export`` produces for the HuggingFace / timm modules:
MatMul + Add linears, Reshape/Transpose to heads, scaled QK^T with a Div, an additive mask,
Softmax, Erf or tanh GELU, and LayerNormalization (or its decomposed Reduce/Sub/Pow/Sqrt/Div form).
"""

from __future__ import annotations

import numpy as np
from onnx import TensorProto

from .builder import GraphBuilder, batch_dim, seq_dim


def _embed(g: GraphBuilder, ids: str, vocab: int, max_pos: int, hidden: int) -> str:
    """Token + position embeddings; positions sliced to the runtime sequence length."""
    tok = g.op("Gather", [g.normal((vocab, hidden), 0.02, "embeddings.word"), ids], axis=0)
    table = g.normal((max_pos, hidden), 0.02, "embeddings.position")
    pos = g.op("Slice", [table, g.ints([0]), g.dim_of(ids, 1), g.ints([0])])
    return g.op("Add", [tok, pos])


def bert(layers: int = 12, batch: int = 1, seq: int = 128, hidden: int = 768, heads: int = 12,
         ffn: int = 3072, vocab: int = 30522, max_pos: int = 512, decomposed_ln: bool = True,
         dynamic: bool = False, seed: int = 0):
    """BERT encoder (post-LN) with an ``attention_mask`` input; outputs the last hidden state."""
    g = GraphBuilder("bert", seed)
    shape = [batch_dim(batch, dynamic), seq_dim(seq, dynamic)]
    g.default_dims = {"N": batch, "S": seq} if dynamic else {}
    ids = g.add_input("input_ids", shape, TensorProto.INT64, kind=f"ids:{vocab}")
    mask = g.add_input("attention_mask", shape, TensorProto.INT64, kind="mask")
    # (1 - mask) * -10000, broadcast to [N, 1, 1, S], as HF's get_extended_attention_mask.
    m = g.op("Cast", [g.op("Unsqueeze", [mask, g.ints([1, 2])])], to=TensorProto.FLOAT)
    bias = g.op("Mul", [g.op("Sub", [g.const(1.0), m]), g.const(-10000.0)])
    x = g.layernorm(_embed(g, ids, vocab, max_pos, hidden), hidden, decomposed_ln, eps=1e-12)
    for _ in range(layers):
        a = g.attention(x, hidden, heads, bias)
        x = g.layernorm(g.op("Add", [a, x]), hidden, decomposed_ln, eps=1e-12)
        h = g.linear(g.gelu_erf(g.linear(x, hidden, ffn, prefix="ffn_in")), ffn, hidden,
                     prefix="ffn_out")
        x = g.layernorm(g.op("Add", [h, x]), hidden, decomposed_ln, eps=1e-12)
    g.op("Identity", [x], name="last_hidden_state")
    g.add_output("last_hidden_state", None)
    return g.build(f"BERT encoder: {layers} layers, hidden {hidden}, {heads} heads, seq {seq}")


def gpt2(layers: int = 12, batch: int = 1, seq: int = 128, hidden: int = 768, heads: int = 12,
         vocab: int = 50257, max_pos: int = 1024, decomposed_ln: bool = False,
         dynamic: bool = False, seed: int = 0):
    """GPT-2 decoder stack (pre-LN, causal mask, tanh GELU); outputs the final hidden state."""
    g = GraphBuilder("gpt2", seed)
    shape = [batch_dim(batch, dynamic), seq_dim(seq, dynamic)]
    g.default_dims = {"N": batch, "S": seq} if dynamic else {}
    ids = g.add_input("input_ids", shape, TensorProto.INT64, kind=f"ids:{vocab}")
    # Causal bias: a constant [max_pos, max_pos] upper triangle of -10000, sliced to [S, S].
    tri = np.triu(np.full((max_pos, max_pos), -10000.0, np.float32), k=1)
    s = g.dim_of(ids, 1)
    bias = g.op("Slice", [g.const(tri, "causal_bias"), g.ints([0, 0]),
                          g.op("Concat", [s, s], axis=0), g.ints([0, 1])])
    x = _embed(g, ids, vocab, max_pos, hidden)
    for _ in range(layers):
        x = g.op("Add", [x, g.attention(g.layernorm(x, hidden, decomposed_ln), hidden, heads,
                                        bias)])
        h = g.linear(g.layernorm(x, hidden, decomposed_ln), hidden, 4 * hidden, prefix="mlp_fc")
        x = g.op("Add", [x, g.linear(g.gelu_tanh(h), 4 * hidden, hidden, prefix="mlp_proj")])
    x = g.layernorm(x, hidden, decomposed_ln)
    g.op("Identity", [x], name="last_hidden_state")
    g.add_output("last_hidden_state", None)
    return g.build(f"GPT-2 decoder: {layers} layers, hidden {hidden}, {heads} heads, seq {seq}")


def vit(layers: int = 12, batch: int = 1, image: int = 224, patch: int = 16, hidden: int = 192,
        heads: int = 3, mlp: int = 768, classes: int = 1000, decomposed_ln: bool = False,
        dynamic: bool = False, seed: int = 0):
    """ViT (tiny/16 by default): patch conv, cls token Concat, pre-LN encoder, linear head."""
    g = GraphBuilder("vit", seed)
    g.default_dims = {"N": batch} if dynamic else {}
    img = g.add_input("input", [batch_dim(batch, dynamic), 3, image, image], kind="image")
    tokens = (image // patch) ** 2
    x = g.conv(img, 3, hidden, patch, stride=patch, pad=0, bias=True, gain=1.0,
               prefix="patch_embed")
    x = g.op("Transpose", [g.op("Reshape", [x, g.ints([0, hidden, tokens])])], perm=[0, 2, 1])
    cls_shape = g.op("Concat", [g.dim_of(img, 0), g.ints([1, hidden])], axis=0)
    cls = g.op("Expand", [g.normal((1, 1, hidden), 0.02, "cls_token"), cls_shape])
    x = g.op("Concat", [cls, x], axis=1)
    x = g.op("Add", [x, g.normal((1, tokens + 1, hidden), 0.02, "pos_embed")])
    for _ in range(layers):
        x = g.op("Add", [x, g.attention(g.layernorm(x, hidden, decomposed_ln, 1e-6), hidden,
                                        heads, None)])
        h = g.linear(g.layernorm(x, hidden, decomposed_ln, 1e-6), hidden, mlp, prefix="mlp_fc")
        x = g.op("Add", [x, g.linear(g.gelu_erf(h), mlp, hidden, prefix="mlp_proj")])
    x = g.layernorm(x, hidden, decomposed_ln, 1e-6)
    cls_out = g.op("Gather", [x, g.ints(0)], axis=1)
    g.op("Gemm", [cls_out, g.normal((classes, hidden), np.sqrt(1.0 / hidden), "head.weight"),
                  g.const(np.zeros(classes), "head.bias")], name="logits", transB=1)
    g.add_output("logits", None)
    return g.build(f"ViT: {layers} layers, dim {hidden}, {heads} heads, patch {patch}")
