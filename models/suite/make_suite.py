"""Regenerate models/suite/: real architectures at real size, written in plain JAX (issue 35).

Needs JAX (`pip install jax jaxlib`, the optional `jax` extra); the files it writes are committed,
so the tests and the benches read them without JAX. Every architecture is one function of a size
(a dict of widths, depths and lengths) and is emitted twice:

  NAME.hlo.pb, NAME.hlo           the full-size module (HLO only: its inputs would be gigabytes)
  NAME_cut.hlo.pb, NAME_cut.hlo   the same code at a small size the test suite compiles
  NAME_cut.io.npz                 the cut's seeded inputs arg0..argN and JAX's outputs out0..outM

exactly as models/ and the zoo store theirs (bf16 values widened to float32 in the `.io.npz`).
Weights are inputs like the activations, seeded here, never downloaded; each module's parameters
are numbered in the order its `inputs()` lists them (`keep_unused`: an input the function ignores
is still a parameter). `index.json` records, per module, its size, argument dtypes and shapes,
HLO instruction count, bytes, and XLA:CPU's compile time of the cut here.

Usage: python models/suite/make_suite.py [NAME ...] [--full-only | --cuts-only]
"""

from __future__ import annotations

import argparse
import json
import math
import sys
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path

import numpy as np

HERE = Path(__file__).resolve().parent

Size = dict[str, int]
Maker = Callable[[np.random.Generator], np.ndarray]


@dataclass(frozen=True)
class Input:
    """One entry parameter: its name (for the reader), shape, dtype and how to seed it."""

    name: str
    shape: tuple[int, ...]
    dtype: str  # "float32", "bfloat16" or "int32"
    make: Maker


@dataclass(frozen=True)
class Arch:
    """An architecture: `build(size)` gives its function (of the inputs, in order) and its inputs."""

    build: Callable[[Size], tuple[Callable, list[Input]]]
    full: Size
    cut: Size
    about: str


# ---------------------------------------------------------------------------------------------
# Seeded inputs


def normal(shape: Sequence[int], scale: float = 1.0, mean: float = 0.0) -> Maker:
    """N(mean, scale²) floats."""
    return lambda rng: (mean + scale * rng.standard_normal(tuple(shape))).astype(np.float32)


def weight(shape: Sequence[int], fan_in: int) -> Maker:
    """A weight matrix scaled by 1/√fan_in, as an initializer would: activations keep unit size."""
    return normal(shape, 1.0 / math.sqrt(fan_in))


def integers(low: int, high: int, shape: Sequence[int] = ()) -> Maker:
    """int32 uniform in [low, high)."""
    return lambda rng: rng.integers(low, high, tuple(shape)).astype(np.int32)


def squares(shape: Sequence[int], scale: float) -> Maker:
    """Non-negative floats (an optimizer's second moment)."""
    return lambda rng: (scale * rng.standard_normal(tuple(shape)) ** 2).astype(np.float32)


def f32(name: str, shape: Sequence[int], make: Maker) -> Input:
    return Input(name, tuple(shape), "float32", make)


def bf16(name: str, shape: Sequence[int], make: Maker) -> Input:
    return Input(name, tuple(shape), "bfloat16", make)


def s32(name: str, shape: Sequence[int], make: Maker) -> Input:
    return Input(name, tuple(shape), "int32", make)


# ---------------------------------------------------------------------------------------------
# Shared layers (each takes the dict of inputs by name)


def _jax():
    import jax
    import jax.numpy as jnp
    from jax import lax

    return jax, jnp, lax


def layer_norm(x, gamma, beta, eps: float = 1e-5):
    _, jnp, _ = _jax()
    mean = jnp.mean(x, axis=-1, keepdims=True)
    var = jnp.mean(jnp.square(x - mean), axis=-1, keepdims=True)
    return (x - mean) * (1.0 / jnp.sqrt(var + eps)) * gamma + beta


def rms_norm(x, gamma, eps: float = 1e-6):
    """LLaMA's RMSNorm: computed in f32, the weight applied in the input's dtype."""
    _, jnp, lax = _jax()
    x32 = x.astype(jnp.float32)
    normed = x32 * lax.rsqrt(jnp.mean(jnp.square(x32), axis=-1, keepdims=True) + eps)
    return normed.astype(x.dtype) * gamma


def mha(x, w_qkv, b_qkv, w_o, b_o, heads: int, mask=None):
    """Multi-head self-attention with one fused QKV projection; `mask` (broadcast to [B, H, S, S])
    is True where a query may attend."""
    jax, jnp, _ = _jax()
    b, s, d = x.shape
    dh = d // heads
    qkv = x @ w_qkv + b_qkv
    q, k, v = (t.reshape(b, s, heads, dh) for t in jnp.split(qkv, 3, axis=-1))
    scores = jnp.einsum("bshd,bthd->bhst", q, k) / math.sqrt(dh)
    if mask is not None:
        scores = jnp.where(mask, scores, -1e9)
    probs = jax.nn.softmax(scores, axis=-1)
    out = jnp.einsum("bhst,bthd->bshd", probs, v).reshape(b, s, d)
    return out @ w_o + b_o


def causal_mask(s: int):
    _, jnp, _ = _jax()
    return jnp.tril(jnp.ones((s, s), dtype=bool))[None, None]


def rope(x, positions):
    """Rotary embedding, rotate-half form (HF LLaMA): x [B, S, H, Dh], positions [S] (f32)."""
    _, jnp, _ = _jax()
    dh = x.shape[-1]
    inv_freq = 1.0 / (10000.0 ** (np.arange(0, dh, 2, dtype=np.float32) / dh))
    angles = positions[:, None] * inv_freq[None, :]
    angles = jnp.concatenate([angles, angles], axis=-1)[None, :, None, :]
    x32 = x.astype(jnp.float32)
    half = dh // 2
    rotated = jnp.concatenate([-x32[..., half:], x32[..., :half]], axis=-1)
    return (x32 * jnp.cos(angles) + rotated * jnp.sin(angles)).astype(x.dtype)


def bf16_dot(a, b, spec: str):
    """A bf16 × bf16 contraction accumulated in f32 (preferred_element_type)."""
    _, jnp, _ = _jax()
    return jnp.einsum(spec, a, b, preferred_element_type=jnp.float32)


# ---------------------------------------------------------------------------------------------
# GPT-2


def gpt2_block_inputs(prefix: str, d: int) -> list[Input]:
    return [
        f32(f"{prefix}ln1_g", (d,), normal((d,), 0.1, 1.0)),
        f32(f"{prefix}ln1_b", (d,), normal((d,), 0.1)),
        f32(f"{prefix}attn_w", (d, 3 * d), weight((d, 3 * d), d)),
        f32(f"{prefix}attn_b", (3 * d,), normal((3 * d,), 0.1)),
        f32(f"{prefix}proj_w", (d, d), weight((d, d), d)),
        f32(f"{prefix}proj_b", (d,), normal((d,), 0.1)),
        f32(f"{prefix}ln2_g", (d,), normal((d,), 0.1, 1.0)),
        f32(f"{prefix}ln2_b", (d,), normal((d,), 0.1)),
        f32(f"{prefix}fc_w", (d, 4 * d), weight((d, 4 * d), d)),
        f32(f"{prefix}fc_b", (4 * d,), normal((4 * d,), 0.1)),
        f32(f"{prefix}out_w", (4 * d, d), weight((4 * d, d), 4 * d)),
        f32(f"{prefix}out_b", (d,), normal((d,), 0.1)),
    ]


def gpt2(size: Size) -> tuple[Callable, list[Input]]:
    """GPT-2 forward: token + position embeddings, pre-LN blocks (causal attention, tanh-GELU MLP),
    final LayerNorm, logits against the tied token embedding."""
    jax, jnp, _ = _jax()
    layers, d, heads, seq, vocab, batch = (size[k] for k in ("layers", "d", "heads", "seq", "vocab", "batch"))
    inputs = [
        s32("tokens", (batch, seq), integers(0, vocab, (batch, seq))),
        f32("wte", (vocab, d), normal((vocab, d), 0.02 * 5)),
        f32("wpe", (seq, d), normal((seq, d), 0.01 * 5)),
    ]
    for layer in range(layers):
        inputs += gpt2_block_inputs(f"h{layer}.", d)
    inputs += [f32("lnf_g", (d,), normal((d,), 0.1, 1.0)), f32("lnf_b", (d,), normal((d,), 0.1))]

    def forward(*args):
        p = dict(zip([i.name for i in inputs], args, strict=True))
        x = p["wte"][p["tokens"]] + p["wpe"][None]
        for layer in range(layers):
            w = {k[len(f"h{layer}.") :]: v for k, v in p.items() if k.startswith(f"h{layer}.")}
            h = layer_norm(x, w["ln1_g"], w["ln1_b"])
            x = x + mha(h, w["attn_w"], w["attn_b"], w["proj_w"], w["proj_b"], heads, causal_mask(seq))
            h = layer_norm(x, w["ln2_g"], w["ln2_b"])
            x = x + jax.nn.gelu(h @ w["fc_w"] + w["fc_b"], approximate=True) @ w["out_w"] + w["out_b"]
        x = layer_norm(x, p["lnf_g"], p["lnf_b"])
        return jnp.einsum("bsd,vd->bsv", x, p["wte"])

    return forward, inputs


# ---------------------------------------------------------------------------------------------
# BERT-base encoder layer


def bert_layer(size: Size) -> tuple[Callable, list[Input]]:
    """One BERT encoder layer, post-LN: self-attention under a padding mask (an additive -10000 on
    padded keys, as BERT applies it), residual, LayerNorm, exact (erf) GELU FFN, residual, LayerNorm."""
    jax, jnp, _ = _jax()
    d, heads, seq, ffn, batch = (size[k] for k in ("d", "heads", "seq", "ffn", "batch"))

    def lengths(rng: np.random.Generator) -> np.ndarray:  # 1 for tokens, 0 for padding at the end
        valid = rng.integers(seq // 2, seq + 1, batch)
        return (np.arange(seq)[None, :] < valid[:, None]).astype(np.int32)

    inputs = [
        f32("x", (batch, seq, d), normal((batch, seq, d))),
        s32("mask", (batch, seq), lengths),
        f32("w_qkv", (d, 3 * d), weight((d, 3 * d), d)),
        f32("b_qkv", (3 * d,), normal((3 * d,), 0.1)),
        f32("w_o", (d, d), weight((d, d), d)),
        f32("b_o", (d,), normal((d,), 0.1)),
        f32("ln1_g", (d,), normal((d,), 0.1, 1.0)),
        f32("ln1_b", (d,), normal((d,), 0.1)),
        f32("w_1", (d, ffn), weight((d, ffn), d)),
        f32("b_1", (ffn,), normal((ffn,), 0.1)),
        f32("w_2", (ffn, d), weight((ffn, d), ffn)),
        f32("b_2", (d,), normal((d,), 0.1)),
        f32("ln2_g", (d,), normal((d,), 0.1, 1.0)),
        f32("ln2_b", (d,), normal((d,), 0.1)),
    ]

    def layer(*args):
        p = dict(zip([i.name for i in inputs], args, strict=True))
        x = p["x"]
        b, s, _ = x.shape
        dh = d // heads
        qkv = x @ p["w_qkv"] + p["b_qkv"]
        q, k, v = (t.reshape(b, s, heads, dh) for t in jnp.split(qkv, 3, axis=-1))
        scores = jnp.einsum("bshd,bthd->bhst", q, k) / math.sqrt(dh)
        scores = scores + (1.0 - p["mask"].astype(jnp.float32))[:, None, None, :] * -10000.0
        attn = jnp.einsum("bhst,bthd->bshd", jax.nn.softmax(scores, axis=-1), v).reshape(b, s, d)
        x = layer_norm(x + attn @ p["w_o"] + p["b_o"], p["ln1_g"], p["ln1_b"], eps=1e-12)
        h = jax.nn.gelu(x @ p["w_1"] + p["b_1"], approximate=False)
        return layer_norm(x + h @ p["w_2"] + p["b_2"], p["ln2_g"], p["ln2_b"], eps=1e-12)

    return layer, inputs


# ---------------------------------------------------------------------------------------------
# LLaMA-style decoder layer (bf16 weights, f32 accumulation)


def llama_weights(d: int, heads: int, kv_heads: int, ffn: int) -> list[Input]:
    dh = d // heads
    return [
        bf16("attn_norm", (d,), normal((d,), 0.1, 1.0)),
        bf16("wq", (d, heads * dh), weight((d, heads * dh), d)),
        bf16("wk", (d, kv_heads * dh), weight((d, kv_heads * dh), d)),
        bf16("wv", (d, kv_heads * dh), weight((d, kv_heads * dh), d)),
        bf16("wo", (heads * dh, d), weight((heads * dh, d), heads * dh)),
        bf16("ffn_norm", (d,), normal((d,), 0.1, 1.0)),
        bf16("w_gate", (d, ffn), weight((d, ffn), d)),
        bf16("w_up", (d, ffn), weight((d, ffn), d)),
        bf16("w_down", (ffn, d), weight((ffn, d), ffn)),
    ]


def llama_attention_and_ffn(p: dict, x, positions, keys, values, mask):
    """The decoder layer around its attention: `keys`/`values` [B, T, KVH, Dh] are what the
    queries at `positions` attend to (under `mask`, [S, T]); returns the layer's output."""
    jax, jnp, _ = _jax()
    b, s, d = x.shape
    kv_heads, dh = keys.shape[2], keys.shape[3]
    heads = p["wq"].shape[1] // dh
    h = rms_norm(x, p["attn_norm"])
    q = bf16_dot(h, p["wq"], "bsd,de->bse").astype(jnp.bfloat16).reshape(b, s, heads, dh)
    q = rope(q, positions).reshape(b, s, kv_heads, heads // kv_heads, dh)
    scores = bf16_dot(q, keys, "bskgd,btkd->bkgst") / math.sqrt(dh)
    scores = jnp.where(mask[None, None, None], scores, -1e9)
    probs = jax.nn.softmax(scores, axis=-1).astype(jnp.bfloat16)
    attn = bf16_dot(probs, values, "bkgst,btkd->bskgd").astype(jnp.bfloat16).reshape(b, s, heads * dh)
    x = x + bf16_dot(attn, p["wo"], "bse,ed->bsd").astype(jnp.bfloat16)
    h = rms_norm(x, p["ffn_norm"])
    gate = bf16_dot(h, p["w_gate"], "bsd,df->bsf")
    up = bf16_dot(h, p["w_up"], "bsd,df->bsf")
    act = (jax.nn.silu(gate) * up).astype(jnp.bfloat16)
    return x + bf16_dot(act, p["w_down"], "bsf,fd->bsd").astype(jnp.bfloat16)


def llama_kv(p: dict, x, positions, kv_heads: int, dh: int):
    """The new tokens' keys (rotated) and values, [B, S, KVH, Dh] bf16."""
    _, jnp, _ = _jax()
    b, s, _ = x.shape
    h = rms_norm(x, p["attn_norm"])
    k = bf16_dot(h, p["wk"], "bsd,de->bse").astype(jnp.bfloat16).reshape(b, s, kv_heads, dh)
    v = bf16_dot(h, p["wv"], "bsd,de->bse").astype(jnp.bfloat16).reshape(b, s, kv_heads, dh)
    return rope(k, positions), v


def llama_prefill(size: Size) -> tuple[Callable, list[Input]]:
    """A LLaMA decoder layer over a prompt: RMSNorm, GQA attention with RoPE under a causal mask,
    residual, RMSNorm, SwiGLU FFN, residual. Also returns the keys and values (the KV cache)."""
    _, jnp, _ = _jax()
    d, heads, kv_heads, ffn, seq, batch = (size[k] for k in ("d", "heads", "kv_heads", "ffn", "seq", "batch"))
    dh = d // heads
    inputs = [bf16("x", (batch, seq, d), normal((batch, seq, d)))] + llama_weights(d, heads, kv_heads, ffn)

    def layer(*args):
        p = dict(zip([i.name for i in inputs], args, strict=True))
        positions = jnp.arange(seq, dtype=jnp.float32)
        k, v = llama_kv(p, p["x"], positions, kv_heads, dh)
        mask = jnp.tril(jnp.ones((seq, seq), dtype=bool))
        return llama_attention_and_ffn(p, p["x"], positions, k, v, mask), k, v

    return layer, inputs


def llama_decode(size: Size) -> tuple[Callable, list[Input]]:
    """One decode step of the same layer: the new token's key and value written into the KV cache
    at a run-time position (dynamic-update-slice), attention over the cache up to that position."""
    _, jnp, lax = _jax()
    d, heads, kv_heads, ffn, cache, batch = (
        size[k] for k in ("d", "heads", "kv_heads", "ffn", "cache", "batch")
    )
    dh = d // heads
    kv_shape = (batch, cache, kv_heads, dh)
    inputs = [
        bf16("x", (batch, 1, d), normal((batch, 1, d))),
        s32("pos", (), integers(cache // 2, cache)),
        bf16("k_cache", kv_shape, normal(kv_shape)),
        bf16("v_cache", kv_shape, normal(kv_shape)),
    ]
    inputs += llama_weights(d, heads, kv_heads, ffn)

    def step(*args):
        p = dict(zip([i.name for i in inputs], args, strict=True))
        pos = p["pos"]
        positions = pos.astype(jnp.float32)[None]
        k, v = llama_kv(p, p["x"], positions, kv_heads, dh)
        k_cache = lax.dynamic_update_slice(p["k_cache"], k, (0, pos, 0, 0))
        v_cache = lax.dynamic_update_slice(p["v_cache"], v, (0, pos, 0, 0))
        mask = (jnp.arange(cache) <= pos)[None, :]
        return llama_attention_and_ffn(p, p["x"], positions, k_cache, v_cache, mask), k_cache, v_cache

    return step, inputs


# ---------------------------------------------------------------------------------------------
# ResNet-50, first stage


def resnet_stage1(size: Size) -> tuple[Callable, list[Input]]:
    """ResNet-50 up to the end of its first stage: conv 7x7/2 (64), batch norm, ReLU, max-pool 3x3/2,
    then three bottleneck blocks (1x1 64, 3x3 64, 1x1 256; a projection shortcut in the first).
    Inference batch norm: running statistics are constants of the module (seeded here, as a
    trained model's would be closed over), scale and shift are inputs."""
    jax, jnp, lax = _jax()
    batch, image, width = size["batch"], size["image"], size["width"]
    stats = np.random.default_rng(50)
    convs: list[tuple[str, int, int, int]] = [("conv1", 7, 3, width)]  # name, kernel, in, out
    for block in range(3):
        cin = width if block == 0 else 4 * width
        convs += [
            (f"b{block}.c1", 1, cin, width),
            (f"b{block}.c2", 3, width, width),
            (f"b{block}.c3", 1, width, 4 * width),
        ]
        if block == 0:
            convs.append(("b0.proj", 1, width, 4 * width))
    inputs = [f32("x", (batch, image, image, 3), normal((batch, image, image, 3)))]
    running: dict[str, tuple[np.ndarray, np.ndarray]] = {}
    for name, k, cin, cout in convs:
        inputs += [
            f32(f"{name}.w", (k, k, cin, cout), weight((k, k, cin, cout), k * k * cin)),
            f32(f"{name}.gamma", (cout,), normal((cout,), 0.1, 1.0)),
            f32(f"{name}.beta", (cout,), normal((cout,), 0.1)),
        ]
        running[name] = (
            (0.1 * stats.standard_normal(cout)).astype(np.float32),
            (0.5 + stats.random(cout)).astype(np.float32),
        )

    def forward(*args):
        p = dict(zip([i.name for i in inputs], args, strict=True))

        def conv_bn(x, name: str, stride: int = 1):
            k = p[f"{name}.w"].shape[0]
            y = lax.conv_general_dilated(
                x,
                p[f"{name}.w"],
                (stride, stride),
                [(k // 2, k // 2)] * 2,
                dimension_numbers=("NHWC", "HWIO", "NHWC"),
            )
            mean, var = running[name]
            return (y - mean) * lax.rsqrt(var + 1e-5) * p[f"{name}.gamma"] + p[f"{name}.beta"]

        x = jax.nn.relu(conv_bn(p["x"], "conv1", 2))
        x = lax.reduce_window(
            x, -jnp.inf, lax.max, (1, 3, 3, 1), (1, 2, 2, 1), ((0, 0), (1, 1), (1, 1), (0, 0))
        )
        for block in range(3):
            h = jax.nn.relu(conv_bn(x, f"b{block}.c1"))
            h = jax.nn.relu(conv_bn(h, f"b{block}.c2"))
            h = conv_bn(h, f"b{block}.c3")
            x = jax.nn.relu(h + (conv_bn(x, "b0.proj") if block == 0 else x))
        return x

    return forward, inputs


# ---------------------------------------------------------------------------------------------
# ViT-B/16 encoder block


def vit_block(size: Size) -> tuple[Callable, list[Input]]:
    """A ViT encoder block over 196 patches + the class token: pre-LN attention and an exact-GELU
    MLP, each with a residual."""
    jax, _, _ = _jax()
    d, heads, seq, mlp, batch = (size[k] for k in ("d", "heads", "seq", "mlp", "batch"))
    inputs = [
        f32("x", (batch, seq, d), normal((batch, seq, d))),
        f32("ln1_g", (d,), normal((d,), 0.1, 1.0)),
        f32("ln1_b", (d,), normal((d,), 0.1)),
        f32("w_qkv", (d, 3 * d), weight((d, 3 * d), d)),
        f32("b_qkv", (3 * d,), normal((3 * d,), 0.1)),
        f32("w_o", (d, d), weight((d, d), d)),
        f32("b_o", (d,), normal((d,), 0.1)),
        f32("ln2_g", (d,), normal((d,), 0.1, 1.0)),
        f32("ln2_b", (d,), normal((d,), 0.1)),
        f32("w_1", (d, mlp), weight((d, mlp), d)),
        f32("b_1", (mlp,), normal((mlp,), 0.1)),
        f32("w_2", (mlp, d), weight((mlp, d), mlp)),
        f32("b_2", (d,), normal((d,), 0.1)),
    ]

    def block(*args):
        p = dict(zip([i.name for i in inputs], args, strict=True))
        x = p["x"]
        x = x + mha(
            layer_norm(x, p["ln1_g"], p["ln1_b"], 1e-6), p["w_qkv"], p["b_qkv"], p["w_o"], p["b_o"], heads
        )
        h = jax.nn.gelu(layer_norm(x, p["ln2_g"], p["ln2_b"], 1e-6) @ p["w_1"] + p["b_1"], approximate=False)
        return x + h @ p["w_2"] + p["b_2"]

    return block, inputs


# ---------------------------------------------------------------------------------------------
# A training step: a small causal transformer LM, forward, backward, AdamW


def train_step(size: Size) -> tuple[Callable, list[Input]]:
    """One AdamW step of a causal LM (token + position embeddings, `layers` pre-LN blocks, untied
    head, next-token cross-entropy): returns the loss, the new parameters, both moments and the
    step count. Hyperparameters (lr 1e-3, betas 0.9/0.999, eps 1e-8, weight decay 0.01 on every
    parameter) are constants; the step count is an input (bias correction uses count + 1)."""
    jax, jnp, _ = _jax()
    layers, d, heads, seq, vocab, batch = (size[k] for k in ("layers", "d", "heads", "seq", "vocab", "batch"))
    params = [f32("emb", (vocab, d), normal((vocab, d), 0.1)), f32("pos", (seq, d), normal((seq, d), 0.1))]
    for layer in range(layers):
        params += gpt2_block_inputs(f"h{layer}.", d)
    params += [
        f32("lnf_g", (d,), normal((d,), 0.1, 1.0)),
        f32("lnf_b", (d,), normal((d,), 0.1)),
        f32("head", (d, vocab), weight((d, vocab), d)),
    ]
    names = [i.name for i in params]
    inputs = [
        s32("tokens", (batch, seq), integers(0, vocab, (batch, seq))),
        s32("labels", (batch, seq), integers(0, vocab, (batch, seq))),
        s32("count", (), integers(0, 100)),
    ]
    inputs += params
    inputs += [f32(f"m.{i.name}", i.shape, normal(i.shape, 1e-3)) for i in params]
    inputs += [f32(f"v.{i.name}", i.shape, squares(i.shape, 1e-3)) for i in params]
    lr, b1, b2, eps, wd = 1e-3, 0.9, 0.999, 1e-8, 0.01

    def loss_fn(p: dict, tokens, labels):
        x = p["emb"][tokens] + p["pos"][None]
        for layer in range(layers):
            w = {k[len(f"h{layer}.") :]: v for k, v in p.items() if k.startswith(f"h{layer}.")}
            h = layer_norm(x, w["ln1_g"], w["ln1_b"])
            x = x + mha(h, w["attn_w"], w["attn_b"], w["proj_w"], w["proj_b"], heads, causal_mask(seq))
            h = layer_norm(x, w["ln2_g"], w["ln2_b"])
            x = x + jax.nn.gelu(h @ w["fc_w"] + w["fc_b"], approximate=True) @ w["out_w"] + w["out_b"]
        logits = layer_norm(x, p["lnf_g"], p["lnf_b"]) @ p["head"]
        log_p = jax.nn.log_softmax(logits, axis=-1)
        return -jnp.mean(jnp.take_along_axis(log_p, labels[..., None], axis=-1))

    def step(*args):
        a = dict(zip([i.name for i in inputs], args, strict=True))
        p = {n: a[n] for n in names}
        loss, grads = jax.value_and_grad(loss_fn)(p, a["tokens"], a["labels"])
        count = a["count"] + 1
        t = count.astype(jnp.float32)
        new_p, new_m, new_v = [], [], []
        for n in names:
            m = b1 * a[f"m.{n}"] + (1 - b1) * grads[n]
            v = b2 * a[f"v.{n}"] + (1 - b2) * jnp.square(grads[n])
            update = (m / (1 - b1**t)) / (jnp.sqrt(v / (1 - b2**t)) + eps) + wd * p[n]
            new_p.append(p[n] - lr * update)
            new_m.append(m)
            new_v.append(v)
        return loss, *new_p, *new_m, *new_v, count

    return step, inputs


# ---------------------------------------------------------------------------------------------
# Mixture-of-experts feed-forward


def moe_ffn(size: Size) -> tuple[Callable, list[Input]]:
    """A top-2 mixture-of-experts FFN over 8 experts with a capacity (1.25x the even share): a
    softmax router, top-k, each (token, choice) given a slot in its expert by a cumulative count,
    tokens scattered into per-expert buffers [E, C, d] (over-capacity ones dropped), the experts'
    GELU MLPs as batched matmuls, results gathered back by (expert, slot) and summed over each
    token's choices, weighted by the renormalised gates. The (expert, slot) pairs are distinct by
    construction, which the scatter says (`unique_indices`); the choices are laid out
    choice-major, so a token's rows are summed by a reshape, not scatter-added by token."""
    jax, jnp, lax = _jax()
    tokens, d, ffn, experts, top = (size[k] for k in ("tokens", "d", "ffn", "experts", "top_k"))
    capacity = math.ceil(1.25 * tokens * top / experts)
    inputs = [
        f32("x", (tokens, d), normal((tokens, d))),
        f32("w_router", (d, experts), weight((d, experts), d)),
        f32("w_in", (experts, d, ffn), weight((experts, d, ffn), d)),
        f32("w_out", (experts, ffn, d), weight((experts, ffn, d), ffn)),
    ]

    def layer(*args):
        p = dict(zip([i.name for i in inputs], args, strict=True))
        x = p["x"]
        probs = jax.nn.softmax(x @ p["w_router"], axis=-1)
        gates, expert = lax.top_k(probs, top)  # [T, k]
        gates = gates / jnp.sum(gates, axis=-1, keepdims=True)
        flat_expert = expert.T.reshape(-1)  # choice-major: every token's first choice claims slots first
        flat_token = jnp.tile(jnp.arange(tokens), top)
        flat_gate = gates.T.reshape(-1)
        one_hot = jax.nn.one_hot(flat_expert, experts, dtype=jnp.int32)
        slot = jnp.take_along_axis(jnp.cumsum(one_hot, axis=0), flat_expert[:, None], axis=1)[:, 0] - 1
        kept = slot < capacity
        buffers = (
            jnp.zeros((experts, capacity, d), x.dtype)
            .at[flat_expert, slot]
            .set(x[flat_token], mode="drop", unique_indices=True)
        )
        hidden = jax.nn.gelu(jnp.einsum("ecd,edf->ecf", buffers, p["w_in"]), approximate=False)
        results = jnp.einsum("ecf,efd->ecd", hidden, p["w_out"])
        rows = (
            results[flat_expert, jnp.minimum(slot, capacity - 1)] * jnp.where(kept, flat_gate, 0.0)[:, None]
        )
        return rows.reshape(top, tokens, d).sum(axis=0)

    return layer, inputs


# ---------------------------------------------------------------------------------------------

SUITE: dict[str, Arch] = {
    "gpt2": Arch(
        gpt2,
        full=dict(layers=12, d=768, heads=12, seq=1024, vocab=50257, batch=1),
        cut=dict(layers=1, d=192, heads=3, seq=128, vocab=512, batch=1),
        about="GPT-2 small forward (tied embedding logits)",
    ),
    "bert_layer": Arch(
        bert_layer,
        full=dict(d=768, heads=12, seq=512, ffn=3072, batch=1),
        cut=dict(d=192, heads=3, seq=128, ffn=768, batch=2),
        about="BERT-base encoder layer, padding mask, erf GELU",
    ),
    "llama_prefill": Arch(
        llama_prefill,
        full=dict(d=4096, heads=32, kv_heads=8, ffn=11008, seq=2048, batch=1),
        cut=dict(d=256, heads=4, kv_heads=2, ffn=512, seq=128, batch=1),
        about="LLaMA-7B decoder layer, prefill: GQA, RoPE, RMSNorm, SwiGLU, bf16",
    ),
    "llama_decode": Arch(
        llama_decode,
        full=dict(d=4096, heads=32, kv_heads=8, ffn=11008, cache=2048, batch=1),
        cut=dict(d=256, heads=4, kv_heads=2, ffn=512, cache=256, batch=1),
        about="LLaMA-7B decoder layer, one decode step against a KV cache, bf16",
    ),
    "resnet50_stage1": Arch(
        resnet_stage1,
        full=dict(batch=8, image=224, width=64),
        cut=dict(batch=1, image=32, width=16),
        about="ResNet-50 stem + first stage (3 bottlenecks), inference batch norm",
    ),
    "vit_block": Arch(
        vit_block,
        full=dict(d=768, heads=12, seq=197, mlp=3072, batch=1),
        cut=dict(d=192, heads=3, seq=65, mlp=768, batch=1),
        about="ViT-B/16 encoder block (196 patches + class token)",
    ),
    "train_step": Arch(
        train_step,
        full=dict(layers=2, d=512, heads=8, seq=256, vocab=8192, batch=8),
        cut=dict(layers=2, d=64, heads=2, seq=32, vocab=128, batch=2),
        about="2-layer transformer LM training step: forward, backward, AdamW",
    ),
    "moe_ffn": Arch(
        moe_ffn,
        full=dict(tokens=2048, d=1024, ffn=4096, experts=8, top_k=2),
        cut=dict(tokens=64, d=128, ffn=256, experts=8, top_k=2),
        about="MoE FFN: top-2 routing over 8 experts, scatter/gather by expert",
    ),
}


def jax_dtype(name: str):
    import jax.numpy as jnp

    return {"float32": jnp.float32, "bfloat16": jnp.bfloat16, "int32": jnp.int32}[name]


def seeded(inputs: list[Input], seed: int) -> list[np.ndarray]:
    """The inputs' values, each rounded to its dtype (a bf16 input as ml_dtypes' bfloat16)."""
    rng = np.random.default_rng(seed)
    return [np.asarray(i.make(rng)).reshape(i.shape).astype(jax_dtype(i.dtype)) for i in inputs]


def instruction_count(text: str) -> int:
    return sum(1 for line in text.splitlines() if " = " in line and not line.lstrip().startswith("HloModule"))


def emit(name: str, arch: Arch, cut: bool, index: dict) -> None:
    """Lower `arch` at its full or cut size; write the HLO (and, for the cut, the .io.npz)."""
    import jax

    size = arch.cut if cut else arch.full
    stem = f"{name}_cut" if cut else name
    function, inputs = arch.build(size)
    jitted = jax.jit(function, keep_unused=True)
    if cut:
        args = seeded(inputs, sum(map(ord, stem)))
        lowered = jitted.lower(*args)
    else:
        lowered = jitted.lower(*[jax.ShapeDtypeStruct(i.shape, jax_dtype(i.dtype)) for i in inputs])
    hlo = lowered.compiler_ir("hlo")
    proto = hlo.as_serialized_hlo_module_proto()
    text = hlo.as_hlo_text()
    (HERE / f"{stem}.hlo.pb").write_bytes(proto)
    (HERE / f"{stem}.hlo").write_text(text)
    entry: dict[str, object] = {
        "arch": name,
        "size": size,
        "about": arch.about,
        "args": [[i.dtype, list(i.shape)] for i in inputs],
        "arg_names": [i.name for i in inputs],
        "hlo_instructions": instruction_count(text),
        "hlo_pb_bytes": len(proto),
        "input_bytes": int(sum(math.prod(i.shape) * (2 if i.dtype == "bfloat16" else 4) for i in inputs)),
    }
    if cut:
        start = time.perf_counter()
        compiled = lowered.compile()
        entry["xla_cpu_compile_s"] = round(time.perf_counter() - start, 4)
        outputs = jax.tree_util.tree_leaves(compiled(*args))
        arrays = {f"arg{k}": widened(a) for k, a in enumerate(args)}
        arrays.update({f"out{k}": widened(np.asarray(o)) for k, o in enumerate(outputs)})
        np.savez_compressed(HERE / f"{stem}.io.npz", **arrays)
        entry["outputs"] = len(outputs)
    index[stem] = entry
    print(
        f"{stem}: {entry['hlo_instructions']} HLO instructions, {len(proto) / 1e3:.0f} kB proto", flush=True
    )


def widened(array: np.ndarray) -> np.ndarray:
    """bf16 stored as float32 (the .io.npz convention of models/); other dtypes as they are."""
    return array.astype(np.float32) if array.dtype.name == "bfloat16" else np.asarray(array)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("names", nargs="*", help=f"architectures (default all: {', '.join(SUITE)})")
    which = parser.add_mutually_exclusive_group()
    which.add_argument("--full-only", action="store_true", help="only the full-size modules")
    which.add_argument("--cuts-only", action="store_true", help="only the cuts")
    args = parser.parse_args(argv)
    unknown = set(args.names) - set(SUITE)
    if unknown:
        parser.error(f"unknown architecture(s): {', '.join(sorted(unknown))}")
    index_path = HERE / "index.json"
    index = json.loads(index_path.read_text()) if index_path.exists() else {}
    for name, arch in SUITE.items():
        if args.names and name not in args.names:
            continue
        if not args.full_only:
            emit(name, arch, cut=True, index=index)
        if not args.cuts_only:
            emit(name, arch, cut=False, index=index)
    index_path.write_text(json.dumps(dict(sorted(index.items())), indent=1) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
