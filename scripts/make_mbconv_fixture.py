"""Write the MobileNet-v2 / EfficientNet block fixture in tests/data/ from JAX (needs JAX; the files are
committed).

An MBConv block on f32[4, 32, 32, 32]: a 1x1 expansion to 128 features with swish, a depthwise 3x3
with swish, squeeze-and-excite (a mean over the positions, 128 -> 8 -> 128, a sigmoid gate), a 1x1
projection back to 32 and the residual. Its straight-line schedule at pre_sched's default pressure
limit spills (tests/test_allocation_end_to_end.py). Written like the bundled models:

  mbconv_block.hlo.pb   the serialized HloModuleProto
  mbconv_block.hlo      the same module as HLO text
  mbconv_block.io.npz   the inputs arg0..arg10 (seeded) and JAX's output out0

Usage: python scripts/make_mbconv_fixture.py
"""

from __future__ import annotations

from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parents[1]
NAME = "mbconv_block"
C, E, R = 32, 128, 8  # features in and out, expanded, squeezed


def main() -> None:
    import jax
    import jax.numpy as jnp
    from jax import lax

    nhwc = ("NHWC", "HWIO", "NHWC")

    def block(x, ke, be, kd, bd, w1, b1, w2, b2, kp, bp):
        h = jax.nn.swish(lax.conv_general_dilated(x, ke, (1, 1), "VALID", dimension_numbers=nhwc) + be)
        h = jax.nn.swish(lax.conv_general_dilated(h, kd, (1, 1), "SAME", dimension_numbers=nhwc,
                                                  feature_group_count=E) + bd)
        squeezed = jnp.mean(h, axis=(1, 2))
        gate = jax.nn.sigmoid(jax.nn.swish(squeezed @ w1 + b1) @ w2 + b2)
        return x + lax.conv_general_dilated(h * gate[:, None, None, :], kp, (1, 1), "VALID",
                                            dimension_numbers=nhwc) + bp

    rng = np.random.default_rng(16)

    def normal(*shape: int, scale: float = 1.0) -> np.ndarray:
        return (rng.standard_normal(shape) * scale).astype(np.float32)

    args = [normal(4, 32, 32, C), normal(1, 1, C, E, scale=C ** -0.5), normal(E, scale=0.1),
            normal(3, 3, 1, E, scale=1 / 3), normal(E, scale=0.1), normal(E, R, scale=E ** -0.5),
            normal(R, scale=0.1), normal(R, E, scale=R ** -0.5), normal(E, scale=0.1),
            normal(1, 1, E, C, scale=E ** -0.5), normal(C, scale=0.1)]
    jitted = jax.jit(block, keep_unused=True)
    hlo = jitted.lower(*args).compiler_ir("hlo")
    folder = ROOT / "tests" / "data"
    folder.mkdir(parents=True, exist_ok=True)
    (folder / f"{NAME}.hlo.pb").write_bytes(hlo.as_serialized_hlo_module_proto())
    (folder / f"{NAME}.hlo").write_text(hlo.as_hlo_text())
    np.savez(folder / f"{NAME}.io.npz", **{f"arg{k}": a for k, a in enumerate(args)},
             out0=np.asarray(jitted(*args)))
    print(f"wrote {folder / NAME}.* (JAX {jax.__version__})")


if __name__ == "__main__":
    main()
