"""Write the convnet training-step fixture in tests/data/ from JAX (needs JAX; the files are committed).

One SGD step of a small conv net (conv 3x3 SAME + relu, 2x2 max pool, conv 3x3 stride 2 + relu,
global mean, dense, softmax cross-entropy), as `jax.value_and_grad` writes it: convolutions and
their transposes, select-and-scatter for the pool's gradient, reductions over non-trailing axes.
At -O3 post_sched once reordered it so that two buffers sharing bytes were live at once, which
birverifier refused (`allocation_overlap`). Written like the bundled models:

  convnet_train.hlo.pb   the serialized HloModuleProto
  convnet_train.hlo      the same module as HLO text
  convnet_train.io.npz   the inputs arg0..arg7 (seeded) and JAX's outputs out0..out6

Usage: python scripts/make_convnet_train_fixture.py
"""

from __future__ import annotations

from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parents[1]
NAME = "convnet_train"


def main() -> None:
    import jax
    import jax.numpy as jnp
    from jax import lax

    def loss(params, x, y):
        k1, c1, k2, c2, w, b = params
        dn = ("NHWC", "HWIO", "NHWC")
        h = jax.nn.relu(lax.conv_general_dilated(x, k1, (1, 1), "SAME", dimension_numbers=dn) + c1)
        h = lax.reduce_window(h, -jnp.inf, lax.max, (1, 2, 2, 1), (1, 2, 2, 1), "VALID")
        h = jax.nn.relu(lax.conv_general_dilated(h, k2, (2, 2), "SAME", dimension_numbers=dn) + c2)
        logits = jnp.mean(h, axis=(1, 2)) @ w + b
        return -jnp.mean(jnp.sum(jax.nn.log_softmax(logits) * jax.nn.one_hot(y, 10), -1))

    def step(x, y, k1, c1, k2, c2, w, b):
        params = (k1, c1, k2, c2, w, b)
        value, grads = jax.value_and_grad(loss)(params, x, y)
        return (value, *(p - 0.1 * g for p, g in zip(params, grads, strict=True)))

    rng = np.random.default_rng(83)
    args = [
        rng.standard_normal((8, 16, 16, 3)).astype(np.float32),
        rng.integers(0, 10, 8).astype(np.int32),
        (rng.standard_normal((3, 3, 3, 16)) * 0.3).astype(np.float32),
        (rng.standard_normal(16) * 0.1).astype(np.float32),
        (rng.standard_normal((3, 3, 16, 32)) * 0.1).astype(np.float32),
        (rng.standard_normal(32) * 0.1).astype(np.float32),
        (rng.standard_normal((32, 10)) / np.sqrt(32)).astype(np.float32),
        (rng.standard_normal(10) * 0.1).astype(np.float32),
    ]
    hlo = jax.jit(step).lower(*args).compiler_ir("hlo")
    outputs = jax.jit(step)(*args)
    folder = ROOT / "tests" / "data"
    (folder / f"{NAME}.hlo.pb").write_bytes(hlo.as_serialized_hlo_module_proto())
    (folder / f"{NAME}.hlo").write_text(hlo.as_hlo_text())
    np.savez(folder / f"{NAME}.io.npz", **{f"arg{k}": a for k, a in enumerate(args)},
             **{f"out{k}": np.asarray(o) for k, o in enumerate(outputs)})
    print(f"wrote {folder / NAME}.* (JAX {jax.__version__})")


if __name__ == "__main__":
    main()
