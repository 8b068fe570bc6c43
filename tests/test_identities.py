"""Algebraic identities in the lowering: an elementwise op of x and its identity element is x
itself, bit for bit, and gets no nest; ops that only look like identities keep theirs."""

from __future__ import annotations

import math
from pathlib import Path

import numpy as np
import pytest
from conftest import run_ncc

from ncc.schemas import common_pb2
from ncc.tools.hlo.hlo_text import parse_hlo_text
from ncc.tools.hlo2penguin.identities import identity_operand
from ncc.tools.hlo2penguin.lower import lower_module
from ncc.tools.hlo2penguin.values import Splat
from ncc.tools.hlo2penguin.views import View

F32, S32 = common_pb2.F32, common_pb2.S32
X = View.whole("x", F32, (4, 8))
N = View.whole("n", S32, (4, 8))


def splat(value: float, dtype: int = F32) -> Splat:
    return Splat(value, dtype, (4, 8))


@pytest.mark.parametrize(
    ("opcode", "ops"),
    [
        ("multiply", [X, splat(1.0)]),
        ("multiply", [splat(1.0), X]),
        ("divide", [X, splat(1.0)]),
        ("add", [X, splat(-0.0)]),
        ("add", [splat(-0.0), X]),
        ("subtract", [X, splat(0.0)]),
        ("maximum", [X, splat(-math.inf)]),
        ("maximum", [splat(-math.inf), X]),
        ("minimum", [X, splat(math.inf)]),
        ("minimum", [splat(math.inf), X]),
    ],
)
def test_float_identities_give_the_operand(opcode: str, ops: list) -> None:
    assert identity_operand(opcode, ops, F32) is X


@pytest.mark.parametrize(
    ("opcode", "ops"),
    [
        ("add", [X, splat(0.0)]),  # -0.0 + 0.0 is +0.0
        ("subtract", [X, splat(-0.0)]),  # -0.0 - -0.0 is +0.0
        ("divide", [splat(1.0), X]),
        ("subtract", [splat(0.0), X]),
        ("multiply", [X, splat(-1.0)]),
        ("maximum", [X, splat(math.inf)]),
        ("maximum", [X, splat(math.nan)]),
        ("power", [X, splat(1.0)]),
        ("multiply", [X, splat(1.0, common_pb2.BF16)]),  # another type: a convert, not an identity
    ],
)
def test_what_only_looks_like_an_identity_is_not_one(opcode: str, ops: list) -> None:
    assert identity_operand(opcode, ops, F32) is None


def test_integer_identities() -> None:
    for opcode, other in [("add", 0), ("subtract", 0), ("multiply", 1), ("divide", 1), ("or", 0), ("xor", 0)]:
        assert identity_operand(opcode, [N, splat(other, S32)], S32) is N
    assert identity_operand("add", [splat(0, S32), N], S32) is N
    assert identity_operand("subtract", [splat(0, S32), N], S32) is None
    assert identity_operand("and", [N, splat(0, S32)], S32) is None


SOFTMAX_MAX = """HloModule softmax_max
region_max {
  a = f32[] parameter(0)
  b = f32[] parameter(1)
  ROOT m = f32[] maximum(a, b)
}
ENTRY main {
  x = f32[256,64]{1,0} parameter(0)
  ninf = f32[] constant(-inf)
  rmax = f32[256]{0} reduce(x, ninf), dimensions={1}, to_apply=region_max
  floor = f32[256]{0} broadcast(ninf), dimensions={}
  m = f32[256]{0} maximum(rmax, floor)
  mb = f32[256,64]{1,0} broadcast(m), dimensions={0}
  ROOT d = f32[256,64]{1,0} subtract(x, mb)
}
"""


def test_the_softmax_maximum_with_minus_infinity_gets_no_nest() -> None:
    """jnp.max(x, initial=-inf), as JAX's softmax writes it: the maximum is the reduction's value."""
    program = lower_module(parse_hlo_text(SOFTMAX_MAX))
    assert not [nest.name for nest in program.nests if nest.source == "m"]
    assert any(st.func == "subtract" for nest in program.nests for st in nest.statements)


IDENTITY_CHAIN = """HloModule identities
ENTRY main {
  x = f32[128,64]{1,0} parameter(0)
  one = f32[] constant(1)
  nzero = f32[] constant(-0)
  ninf = f32[] constant(-inf)
  b1 = f32[128,64]{1,0} broadcast(one), dimensions={}
  bz = f32[128,64]{1,0} broadcast(nzero), dimensions={}
  bi = f32[128,64]{1,0} broadcast(ninf), dimensions={}
  p = f32[128,64]{1,0} multiply(b1, x)
  s = f32[128,64]{1,0} add(p, bz)
  q = f32[128,64]{1,0} divide(s, b1)
  ROOT m = f32[128,64]{1,0} maximum(q, bi)
}
"""


@pytest.mark.slow
def test_a_chain_of_identities_returns_its_input_bit_for_bit(tmp_path: Path) -> None:
    """Signed zeros, infinities and NaN come back unchanged, and --verify agrees with the HLO."""
    model = tmp_path / "identities.hlo"
    model.write_text(IDENTITY_CHAIN)
    program = lower_module(parse_hlo_text(IDENTITY_CHAIN))
    assert not [st for nest in program.nests for st in nest.statements if st.op != "dma"]
    x = np.random.default_rng(0).normal(0, 3, (128, 64)).astype(np.float32)
    x[0, :6] = [0.0, -0.0, np.inf, -np.inf, np.nan, 1e-42]
    inputs, out = tmp_path / "in.npz", tmp_path / "out.npz"
    np.savez(inputs, arg0=x)
    neff = tmp_path / "identities.neff"
    done = run_ncc("compile", str(model), "--output", str(neff), "--verify")
    assert done.returncode == 0, done.stderr
    ran = run_ncc("run", str(neff), "--inputs", str(inputs), "--output", str(out))
    assert ran.returncode == 0, ran.stderr
    assert np.array_equal(np.load(out)["out0"].view(np.uint32), x.view(np.uint32))
