"""Write the odd-shapes fixtures in tests/data/odd/ from JAX (needs JAX; the files are committed).

Models no part of ncc was tuned on: every dimension a prime or just off a multiple of 128, so row
tiles end in part tiles, reductions run over odd extents and a dot's contraction over a tail.
Each is written like the bundled models (NAME.hlo.pb, NAME.hlo, NAME.io.npz with seeded inputs
argK and JAX's outputs outK; bf16 values stored as float32):

  chain_1031       40 elementwise ops (tanh, sin, multiply-add) on f32[1031, 130]: a long loop
                   body over 8 full row tiles and a part tile of 7 rows
  reduce_3_129_65  exp, a sum and a max over the middle axis of f32[3, 129, 65], transposed
  attention_300    softmax(q kᵀ / √72) v on f32[300, 72]
  mlp_bf16         gelu(x @ w1) @ w2, bf16[257, 129] @ bf16[129, 511] @ bf16[511, 67]
  conv_dilated     a convolution of f32[3, 37, 29, 5] by a 3 x 4 kernel to 7 channels, NHWC:
                   stride (2, 1), rows dilated 2, padding (2, 1) and (0, 3)
  maxpool_mean     a 3 x 3 max pool, stride 2, padding 1, of f32[2, 31, 27, 10], then the mean over
                   the rows and columns
  attention_bhqk   batched heads, bf16: softmax(q kᵀ / 5) v over [2, 3, 45 | 61, 25], the
                   probabilities rounded to bf16, f32 accumulation, output in [b, q, h, d] order
  segment_sum      rows of f32[203, 9] added by their s32 segment ids into 17 segments (a scatter)
  triangular_loop  fori_loop(0, 6) around fori_loop(0, i) on f32[37, 129]: an inner loop whose trip
                   count is the outer loop's counter (the outer loop unrolls so that it folds)
  conv_bf16_f32    a bf16 convolution with an f32 result (preferred_element_type), [2, 19, 23, 16]
                   by a 3 x 3 kernel to 24 channels, stride (2, 1), padding (1, 1) and (0, 2)

Usage: python scripts/make_odd_shapes_fixture.py
"""

from __future__ import annotations

from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parents[1]
FOLDER = ROOT / "tests" / "data" / "odd"


def main() -> None:
    import jax
    import jax.numpy as jnp

    rng = np.random.default_rng(35)
    bf16 = jnp.bfloat16

    def chain(x):
        for i in range(40):
            x = jnp.tanh(x * 0.9 + 0.1) if i % 2 else x * 0.5 + jnp.sin(x)
        return x

    def reduce(x):
        return (jnp.exp(x).sum(axis=1) / x.max(axis=1)).T

    def attention(q, k, v):
        return jax.nn.softmax(q @ k.T / np.sqrt(72.0), axis=-1) @ v

    def mlp(x, w1, w2):
        return jax.nn.gelu(x @ w1) @ w2

    def conv(x, w):
        return jax.lax.conv_general_dilated(x, w, (2, 1), ((2, 1), (0, 3)), rhs_dilation=(2, 1),
                                            dimension_numbers=("NHWC", "HWIO", "NHWC"))

    def maxpool(x):
        padding = ((0, 0), (1, 1), (1, 1), (0, 0))
        pooled = jax.lax.reduce_window(x, -jnp.inf, jax.lax.max, (1, 3, 3, 1), (1, 2, 2, 1), padding)
        return pooled.mean(axis=(1, 2))

    def bhqk(q, k, v):
        s = jnp.einsum("bhqd,bhkd->bhqk", q, k, preferred_element_type=jnp.float32) / 5.0
        p = jax.nn.softmax(s, axis=-1).astype(bf16)
        return jnp.einsum("bhqk,bhkd->bqhd", p, v, preferred_element_type=jnp.float32)

    def segments(x, ids):
        return jax.ops.segment_sum(x, ids, num_segments=17)

    def triangular(x):
        def outer(i, y):
            return jax.lax.fori_loop(0, i, lambda j, z: z * 0.9 + jnp.sin(z + j), y)
        return jax.lax.fori_loop(0, 6, outer, x)

    def conv_bf16(x, w):
        return jax.lax.conv_general_dilated(x, w, (2, 1), ((1, 1), (0, 2)),
                                            dimension_numbers=("NHWC", "HWIO", "NHWC"),
                                            preferred_element_type=jnp.float32)

    models = {
        "chain_1031": (chain, [((1031, 130), jnp.float32)]),
        "reduce_3_129_65": (reduce, [((3, 129, 65), jnp.float32)]),
        "attention_300": (attention, [((300, 72), jnp.float32)] * 3),
        "mlp_bf16": (mlp, [((257, 129), bf16), ((129, 511), bf16), ((511, 67), bf16)]),
        "conv_dilated": (conv, [((3, 37, 29, 5), jnp.float32), ((3, 4, 5, 7), jnp.float32)]),
        "maxpool_mean": (maxpool, [((2, 31, 27, 10), jnp.float32)]),
        "attention_bhqk": (bhqk, [((2, 3, 45, 25), bf16), ((2, 3, 61, 25), bf16), ((2, 3, 61, 25), bf16)]),
        "segment_sum": (segments, [((203, 9), jnp.float32), ((203,), 17)]),  # an int: ids below it
        "triangular_loop": (triangular, [((37, 129), jnp.float32)]),
        "conv_bf16_f32": (conv_bf16, [((2, 19, 23, 16), bf16), ((3, 3, 16, 24), bf16)]),
    }
    FOLDER.mkdir(parents=True, exist_ok=True)
    for name, (function, shapes) in models.items():
        args = [jnp.asarray(rng.integers(0, dtype, shape), jnp.int32) if isinstance(dtype, int)
                else jnp.asarray(rng.standard_normal(shape).astype(np.float32), dtype)
                for shape, dtype in shapes]
        lowered = jax.jit(function).lower(*args)
        hlo = lowered.compiler_ir("hlo")
        (FOLDER / f"{name}.hlo.pb").write_bytes(hlo.as_serialized_hlo_module_proto())
        (FOLDER / f"{name}.hlo").write_text(hlo.as_hlo_text())
        outputs = jax.tree_util.tree_leaves(lowered.compile()(*args))
        arrays = {f"arg{k}": np.asarray(a, np.int32 if a.dtype == jnp.int32 else np.float32)
                  for k, a in enumerate(args)}
        arrays.update({f"out{k}": np.asarray(o, np.float32) for k, o in enumerate(outputs)})
        np.savez(FOLDER / f"{name}.io.npz", **arrays)
        print(f"wrote {FOLDER / name}.* (JAX {jax.__version__})")


if __name__ == "__main__":
    main()
