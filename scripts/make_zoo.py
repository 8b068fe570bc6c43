"""Regenerate the JAX model zoo in models/: programs built from the HLO that real JAX code emits.

Needs JAX (`pip install jax jaxlib`, an optional extra: the files it writes are committed, so
nothing else needs JAX). For each model it traces the function with `jax.jit(f).lower(*args)`,
runs it on seeded inputs and writes, like the bundled models:

  NAME.hlo.pb   the serialized HloModuleProto
  NAME.hlo      the same module as HLO text
  NAME.io.npz   the inputs arg0..argN and JAX's outputs out0..outM

and adds NAME to models/index.json (argument dtypes and shapes, HLO instruction count, and how
long XLA:CPU took to compile it here). Usage: python scripts/make_zoo.py [NAME ...]
"""

from __future__ import annotations

import json
import sys
import time
from collections.abc import Callable
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parents[1]
MODELS = ROOT / "models"


def zoo() -> dict[str, tuple[Callable, Callable[[np.random.Generator], list[np.ndarray]], str]]:
    """name -> (function, seeded inputs, one-line description)."""
    import jax
    import jax.numpy as jnp
    from jax import lax

    def cnn(x, w1, w2, dense):
        nhwc = ("NHWC", "HWIO", "NHWC")
        y = lax.conv_general_dilated(x, w1, (1, 1), "SAME", dimension_numbers=nhwc)
        y = lax.reduce_window(jax.nn.relu(y), -jnp.inf, lax.max, (1, 2, 2, 1), (1, 2, 2, 1), "VALID")
        y = lax.conv_general_dilated(y, w2, (2, 2), ((1, 1), (1, 1)), dimension_numbers=nhwc)
        return jnp.mean(jax.nn.relu(y), axis=(1, 2)) @ dense

    def decoder_step(tokens, table, k_cache, v_cache, pos, wq):
        h = table[tokens]
        q = h @ wq
        k_cache = lax.dynamic_update_slice(k_cache, h[:, None, :], (0, pos, 0))
        v_cache = lax.dynamic_update_slice(v_cache, h[:, None, :], (0, pos, 0))
        p = jax.nn.softmax(jnp.einsum("bd,btd->bt", q, k_cache) / 8.0, axis=-1)
        return jnp.einsum("bt,btd->bd", p, v_cache), k_cache, v_cache

    def rnn(xs, h0, w, u):
        def step(h, x):
            h = jnp.tanh(x @ w + h @ u)
            return h, h
        return lax.scan(step, h0, xs)

    def sample_head(logits):
        top_values, top_indices = lax.top_k(logits, 4)
        return (jnp.argmax(logits, axis=-1), jnp.max(jax.nn.softmax(logits, axis=-1), axis=-1), top_values,
                top_indices, jnp.sort(logits[:, :100], axis=-1))

    def cumsum(x, counts):
        return jnp.cumsum(x, axis=1), jnp.cumsum(counts, axis=0)

    def padded_batch(x, lengths):
        padded = jnp.pad(x, ((0, 0), (0, 5)))
        mask = jnp.arange(padded.shape[1])[None, :] < lengths[:, None]
        return jnp.where(mask, padded, 0.0).sum(axis=1) / jnp.maximum(lengths, 1)

    def scatter_add(x, rows, updates):
        return x.at[rows].add(updates), x.at[rows].max(updates)

    def cnn_train(x, labels, w1, dense):
        def loss(w1, dense):
            y = lax.conv_general_dilated(x, w1, (1, 1), "SAME", dimension_numbers=("NHWC", "HWIO", "NHWC"))
            y = lax.reduce_window(jax.nn.relu(y), -jnp.inf, lax.max, (1, 2, 2, 1), (1, 2, 2, 1), "VALID")
            log_p = jax.nn.log_softmax(jnp.mean(y, axis=(1, 2)) @ dense)
            return -jnp.mean(jnp.take_along_axis(log_p, labels[:, None], axis=1))
        value, (g1, g2) = jax.value_and_grad(loss, argnums=(0, 1))(w1, dense)
        return value, w1 - 0.1 * g1, dense - 0.1 * g2

    def bit_hash(x, salt):
        bits = lax.bitcast_convert_type(x, jnp.uint32) ^ salt
        bits = bits ^ (bits >> 16)
        bits = bits * jnp.uint32(0x45D9F3B)
        bits = bits ^ (bits >> 16)
        halves = lax.bitcast_convert_type(bits, jnp.uint16)
        return (bits, lax.population_count(bits), lax.clz(bits), halves.astype(jnp.int16) // jnp.int16(-3),
                jnp.sum(lax.population_count(halves).astype(jnp.int32), axis=-1))

    def nan_guard(x):
        y = jnp.log(x)  # NaN wherever x < 0
        return jnp.where(jnp.isnan(y), 0.0, y), jnp.isfinite(y)

    def vae_sample(mu, logvar, key):
        eps = jax.random.normal(jax.random.wrap_key_data(key), mu.shape)
        kl = -0.5 * jnp.sum(1 + logvar - mu ** 2 - jnp.exp(logvar))
        return mu + jnp.exp(0.5 * logvar) * eps, kl

    def depthwise_train(x, depthwise, pointwise, target):
        def loss(depthwise, pointwise):
            nhwc = ("NHWC", "HWIO", "NHWC")
            y = lax.conv_general_dilated(x, depthwise, (1, 1), "SAME", feature_group_count=x.shape[-1],
                                         dimension_numbers=nhwc)
            y = lax.conv_general_dilated(jnp.clip(y, 0, 6), pointwise, (1, 1), "VALID",
                                         dimension_numbers=nhwc)
            return jnp.mean((y - target) ** 2)
        return jax.grad(loss, argnums=(0, 1))(depthwise, pointwise)

    def normal(*shape):
        return lambda rng: rng.standard_normal(shape).astype(np.float32)

    def scaled(scale, *shape):  # weights small enough that 1,000 steps of tanh do not saturate
        return lambda rng: (scale * rng.standard_normal(shape)).astype(np.float32)

    def ints(low, high, *shape):
        return lambda rng: rng.integers(low, high, shape).astype(np.int32)

    def inputs(*makers):
        return lambda rng: [make(rng) for make in makers]

    def quarter_steps(rng):  # logits rounded to 0.25: ties, so argmax's first-index rule matters
        return (np.round(rng.standard_normal((4, 1000)) * 4) / 4).astype(np.float32)

    return {
        "cnn": (cnn, inputs(normal(2, 16, 16, 3), normal(3, 3, 3, 8), normal(3, 3, 8, 16), normal(16, 10)),
                "two convolutions (SAME, then stride 2), ReLU, 2x2 max pool, global mean, dense"),
        "decoder_step": (decoder_step, inputs(ints(0, 100, 4), normal(100, 64), normal(4, 16, 64),
                                              normal(4, 16, 64), ints(0, 16), normal(64, 64)),
                         "embedding lookup (gather), KV-cache update at a run-time position, attention read"),
        "rnn": (rnn, inputs(normal(10, 4, 32), normal(4, 32), normal(32, 32), normal(32, 32)),
                "lax.scan tanh RNN over 10 steps (a while loop with dynamic slices)"),
        "rnn_long": (rnn, inputs(normal(1000, 4, 32), normal(4, 32), scaled(0.2, 32, 32),
                                 scaled(0.2, 32, 32)),
                     "the same RNN over 1,000 steps: the while loop stays a loop (a Repeat region)"),
        "sample_head": (sample_head, inputs(quarter_steps),
                        "argmax, top-4, a sort and the top softmax probability over 1000 logits with ties"),
        "cumsum": (cumsum, inputs(normal(8, 50), ints(-9, 10, 8, 50)),
                   "cumulative sums (reduce-window): f32 along rows, s32 down columns"),
        "padded_batch": (padded_batch, inputs(normal(4, 20), ints(0, 26, 4)),
                         "pad, a length mask from iota, masked mean"),
        "scatter_add": (scatter_add, inputs(normal(10, 8), ints(0, 10, 12), normal(12, 8)),
                        "x.at[rows].add(u) and .max(u) with repeated rows (scatter)"),
        "cnn_train": (cnn_train,
                      inputs(normal(2, 12, 12, 3), ints(0, 10, 2), normal(3, 3, 3, 8), normal(8, 10)),
                      "a training step: conv, max pool and cross-entropy (take_along_axis), their "
                      "gradients (select-and-scatter, transposed convolutions) and an SGD update"),
        "bit_hash": (bit_hash,
                     inputs(normal(6, 40), lambda rng: rng.integers(0, 2**32, (6, 40), dtype=np.uint32)),
                     "bitcast-convert f32 to u32 and u16 halves, xorshift-multiply hashing, popcnt, clz, "
                     "s16"),
        "nan_guard": (nan_guard, inputs(normal(128, 40)),
                      "jnp.where(jnp.isnan(log(x)), 0, log(x)) and isfinite"),
        "vae_sample": (vae_sample,
                       inputs(normal(16, 32), normal(16, 32), lambda rng: np.array([0, 7], dtype=np.uint32)),
                       "jax.random.normal (threefry bits, erf_inv) reparameterization and a KL term"),
        "depthwise_train": (depthwise_train,
                            inputs(normal(2, 14, 14, 16), normal(3, 3, 1, 16), normal(1, 1, 16, 32),
                                   normal(2, 14, 14, 32)),
                            "the weight gradients of a depthwise (ReLU6) and a pointwise convolution"),
    }


def main() -> int:
    import jax

    chosen = set(sys.argv[1:])
    index_path = MODELS / "index.json"
    index = json.loads(index_path.read_text())
    for name, (function, make_inputs, _) in zoo().items():
        if chosen and name not in chosen:
            continue
        args = [np.asarray(a) for a in make_inputs(np.random.default_rng(sum(map(ord, name))))]
        lowered = jax.jit(function).lower(*args)
        hlo = lowered.compiler_ir("hlo")
        (MODELS / f"{name}.hlo.pb").write_bytes(hlo.as_serialized_hlo_module_proto())
        text = hlo.as_hlo_text()
        (MODELS / f"{name}.hlo").write_text(text)
        start = time.perf_counter()
        compiled = lowered.compile()
        compile_s = time.perf_counter() - start
        outputs = jax.tree_util.tree_leaves(compiled(*args))
        arrays = {f"arg{k}": a for k, a in enumerate(args)}
        arrays.update({f"out{k}": np.asarray(o) for k, o in enumerate(outputs)})
        np.savez(MODELS / f"{name}.io.npz", **arrays)
        index[name] = {
            "args": [[str(a.dtype), list(a.shape)] for a in args],
            "xla_cpu_compile_s": round(compile_s, 4),
            "hlo_instructions": sum(1 for line in text.splitlines() if " = " in line),
            "zoo": True,
        }
        print(f"{name}: {len(outputs)} output(s), XLA:CPU compile {compile_s:.3f} s")
    index_path.write_text(json.dumps(index, indent=1) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
