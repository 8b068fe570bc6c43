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

    models = {
        "chain_1031": (chain, [((1031, 130), jnp.float32)]),
        "reduce_3_129_65": (reduce, [((3, 129, 65), jnp.float32)]),
        "attention_300": (attention, [((300, 72), jnp.float32)] * 3),
        "mlp_bf16": (mlp, [((257, 129), bf16), ((129, 511), bf16), ((511, 67), bf16)]),
    }
    FOLDER.mkdir(parents=True, exist_ok=True)
    for name, (function, shapes) in models.items():
        args = [jnp.asarray(rng.standard_normal(shape).astype(np.float32), dtype) for shape, dtype in shapes]
        lowered = jax.jit(function).lower(*args)
        hlo = lowered.compiler_ir("hlo")
        (FOLDER / f"{name}.hlo.pb").write_bytes(hlo.as_serialized_hlo_module_proto())
        (FOLDER / f"{name}.hlo").write_text(hlo.as_hlo_text())
        outputs = jax.tree_util.tree_leaves(lowered.compile()(*args))
        arrays = {f"arg{k}": np.asarray(a, np.float32) for k, a in enumerate(args)}
        arrays.update({f"out{k}": np.asarray(o, np.float32) for k, o in enumerate(outputs)})
        np.savez(FOLDER / f"{name}.io.npz", **arrays)
        print(f"wrote {FOLDER / name}.* (JAX {jax.__version__})")


if __name__ == "__main__":
    main()
