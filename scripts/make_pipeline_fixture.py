"""Write the software-pipelining test fixture in tests/data/ from JAX (needs JAX; the files are committed).

The model is a load → compute → store elementwise loop over 16 row tiles of f32[2048, 64] whose
compute alternates between the activation engine (tanh, exp) and the vector engine (× 0.5), every
op traced inside `set_xla_metadata(ncc_num_stages="3")`, so the HLO carries the request as the
frontend attribute `ncc_num_stages` on each op. Written like the bundled models:

  pipelined_chain.hlo.pb   the serialized HloModuleProto
  pipelined_chain.hlo      the same module as HLO text
  pipelined_chain.io.npz   the input arg0 (seeded) and JAX's output out0

Usage: python scripts/make_pipeline_fixture.py
"""

from __future__ import annotations

from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parents[1]
NAME = "pipelined_chain"
SHAPE = (2048, 64)


def main() -> None:
    import jax
    import jax.numpy as jnp
    from jax.experimental.xla_metadata import set_xla_metadata

    def chain(x):
        with set_xla_metadata(ncc_num_stages="3"):
            a = jnp.tanh(x) * 0.5
            b = jnp.exp(a) * 0.5
            return jnp.tanh(b) * 0.5

    x = np.random.default_rng(10).standard_normal(SHAPE).astype(np.float32)
    lowered = jax.jit(chain).lower(x)
    hlo = lowered.compiler_ir("hlo")
    folder = ROOT / "tests" / "data"
    folder.mkdir(parents=True, exist_ok=True)
    (folder / f"{NAME}.hlo.pb").write_bytes(hlo.as_serialized_hlo_module_proto())
    (folder / f"{NAME}.hlo").write_text(hlo.as_hlo_text())
    np.savez(folder / f"{NAME}.io.npz", arg0=x, out0=np.asarray(jax.jit(chain)(x)))
    print(f"wrote {folder / NAME}.* (JAX {jax.__version__})")


if __name__ == "__main__":
    main()
