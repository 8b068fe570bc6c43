"""Masks affine in the index (tools/hlo2penguin/affine_masks.py): a causal mask built from iotas
becomes one POOL affine_select per score tile, computed from the tile's position, with no mask
built, stored or loaded; what is not such a mask stays a select; the op's semantics in the
simulator and its checks in the verifier; and from the CLI the same outputs as a mask given as an
input, in less time."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
from orchestrator_support import compile_and_run
from sim_builders import POOL, SP, hbm_2d, onchip
from test_penguin_opt import lowered, softmax_of_masked
from walrus_builders import Bir, run_passes

from ncc.schemas import bir_pb2, common_pb2
from ncc.tools.common.errors import CompileError
from ncc.tools.hlo_opt.passes.dce import eliminate_dead_code
from ncc.tools.sim import simulate_program
from ncc.tools.walrus_driver.pass_manager import DEFAULT_PASSES

HEADER = """HloModule causal
ADD { a = f32[] parameter(0)  b = f32[] parameter(1)  ROOT s = f32[] add(a, b) }
MAX { a = f32[] parameter(0)  b = f32[] parameter(1)  ROOT m = f32[] maximum(a, b) }
"""


def _masked_softmax(mask_lines: str, select: str = "masked = f32[2,256,384] select(mb, s, bigb)",
                    mask_parameter: bool = False) -> str:
    """A softmax over f32[2, 256, 384] scores under the pred[256, 384] `mask` that `mask_lines`
    compute (or a parameter), as JAX writes `where(mask, s, -1e9)`: the mask reshaped and broadcast
    over the heads."""
    mask = "  mask = pred[256,384] parameter(1)\n" if mask_parameter else mask_lines
    return HEADER + f"""ENTRY main {{
  s = f32[2,256,384] parameter(0)
{mask}  m3 = pred[1,256,384] reshape(mask)
  m2 = pred[256,384] reshape(m3)
  mb = pred[2,256,384] broadcast(m2), dimensions={{1,2}}
  big = f32[] constant(-1e9)
  bigb = f32[2,256,384] broadcast(big), dimensions={{}}
  {select}
""" + softmax_of_masked(2, 256, 384)


# jnp.tril(jnp.ones(...)) as JAX lowers it: iota >= iota, then a select of constant predicates
TRIL = """  rows = s32[256] iota(), iota_dimension=0
  rb = s32[256,384] broadcast(rows), dimensions={0}
  cols = s32[384] iota(), iota_dimension=0
  cb = s32[384,256] broadcast(cols), dimensions={0}
  ct = s32[256,384] transpose(cb), dimensions={1,0}
  ge = pred[256,384] compare(rb, ct), direction=GE
  t = pred[] constant(true)
  tb = pred[256,384] broadcast(t), dimensions={}
  f = pred[] constant(false)
  fb = pred[256,384] broadcast(f), dimensions={}
  mask = pred[256,384] select(ge, tb, fb)
"""
CAUSAL = _masked_softmax(TRIL)


def _statements(program, op: str) -> list:
    return [st for nest in program.nests for st in nest.statements if st.op == op]


def test_a_causal_mask_is_one_affine_select_and_nothing_builds_it() -> None:
    program = lowered(CAUSAL)
    [select] = _statements(program, "affine_select")
    fill, const, row, column = select.scalars
    assert (fill, const, row, column) == (-1e9, 0.0, 1.0, -1.0)  # keep where row - column >= 0
    # the mask's own nests are still lowered (values are lowered as they come), but nothing reads
    # what they store: dce removes them
    eliminate_dead_code(program)
    mask = {"rows", "rb", "cols", "cb", "ct", "ge", "tb", "fb", "mask", "m3", "m2", "mb"}
    assert not [st.name for nest in program.nests for st in nest.statements if st.source in mask]
    assert _statements(program, "select") == []


@pytest.mark.parametrize(("lines", "select", "expected"), [
    # x where not (row < column), written with the fill first: keep row - column >= 0
    (TRIL.replace("direction=GE", "direction=LT").replace("select(ge, tb, fb)", "select(ge, fb, tb)"),
     "masked = f32[2,256,384] select(mb, s, bigb)", (0.0, 1.0, -1.0)),
    # a window offset by 16 and the fill on the true side: keep where not (column > row + 16)
    (TRIL.replace("ge = pred[256,384] compare(rb, ct), direction=GE",
                  "sixteen = s32[] constant(16)\n  sb = s32[256,384] broadcast(sixteen), dimensions={}\n"
                  "  shifted = s32[256,384] add(rb, sb)\n"
                  "  ge = pred[256,384] compare(ct, shifted), direction=GT"),
     "masked = f32[2,256,384] select(mb, bigb, s)", (16.0, 1.0, -1.0)),
])
def test_other_ways_of_writing_a_half_plane_give_its_predicate(lines: str, select: str, expected) -> None:
    [st] = _statements(lowered(_masked_softmax(lines, select)), "affine_select")
    assert tuple(st.scalars[1:]) == expected


@pytest.mark.parametrize("mask", [
    # a product of two indices is not affine
    TRIL.replace("ge = pred[256,384] compare(rb, ct), direction=GE",
                 "sq = s32[256,384] multiply(rb, ct)\n  lim = s32[] constant(900)\n"
                 "  lb = s32[256,384] broadcast(lim), dimensions={}\n"
                 "  ge = pred[256,384] compare(sq, lb), direction=LT"),
    # two half-planes together (a band) are not one
    TRIL.replace("mask = pred[256,384] select(ge, tb, fb)",
                 "lt = pred[256,384] compare(rb, ct), direction=LT\n  mask = pred[256,384] or(ge, lt)"),
    # an equality is a line, not a half-plane
    TRIL.replace("direction=GE", "direction=EQ"),
])
def test_what_is_not_one_half_plane_stays_a_select(mask: str) -> None:
    program = lowered(_masked_softmax(mask))
    assert _statements(program, "affine_select") == []
    assert len(_statements(program, "select")) >= 1


def test_a_mask_that_is_an_input_stays_a_select() -> None:
    program = lowered(_masked_softmax("", mask_parameter=True))
    assert _statements(program, "affine_select") == []


def _affine_select_program(scalars: list[float], in_cols: int = 64) -> bir_pb2.Program:
    """y = affine_select(x) over one [128, 64] tile."""
    b = Bir("affine_select")
    b.hbm("x", [128, 64], index=0)
    b.hbm("y", [128, 64], role=bir_pb2.OUTPUT, index=0)
    b.buffer("sx", 64 * 4)
    b.buffer("sy", 64 * 4)
    b.add("dma", SP, [onchip("sx", 128, 64)], [hbm_2d("x", 128, 64)], queue=0)
    b.add("affine_select", POOL, [onchip("sy", 128, 64)], [onchip("sx", 128, in_cols)], name="mask",
          scalars=scalars)
    b.add("dma", SP, [hbm_2d("y", 128, 64)], [onchip("sy", 128, 64)], queue=1)
    return b.build()


def test_the_simulator_keeps_the_elements_where_the_affine_predicate_holds() -> None:
    x = np.random.default_rng(3).normal(size=(128, 64)).astype(np.float32)
    ctx = run_passes(_affine_select_program([-np.inf, 5.0, -1.0, 2.0]), ",".join(DEFAULT_PASSES))
    result = simulate_program(ctx.program, {"arg0": x})
    assert result.races == [] and result.deadlock is None
    p, f = np.arange(128)[:, None], np.arange(64)[None, :]
    np.testing.assert_array_equal(result.outputs["out0"], np.where(5 - p + 2 * f >= 0, x, -np.inf))


def test_a_malformed_affine_select_is_refused() -> None:
    with pytest.raises(CompileError) as err:
        run_passes(_affine_select_program([0.0, 1.0, 1.0, 1.0], in_cols=32), "birverifier", verify_each=False)
    assert err.value.code == "E410" and "element_count: mask" in err.value.message
    with pytest.raises(CompileError) as err:
        simulate_program(_affine_select_program([0.0, 1.0]), {"arg0": np.zeros((128, 64), np.float32)},
                         check_races=False)
    assert err.value.code == "E603" and "4 scalars" in err.value.message
    for hostile in (float("nan"), 1e300, 0.5):  # what a mutated NEFF may hold: refused, no traceback
        with pytest.raises(CompileError) as err:
            simulate_program(_affine_select_program([0.0, hostile, 1.0, 1.0]),
                             {"arg0": np.zeros((128, 64), np.float32)}, check_races=False)
        assert err.value.code == "E603" and "not an integer" in err.value.message
    integers = _affine_select_program([float("nan"), 0.0, 1.0, 1.0])
    for instr in integers.instructions:
        for ap in (*instr.inputs, *instr.outputs):
            ap.dtype = common_pb2.S32
    for tensor in integers.hbm:
        tensor.dtype = common_pb2.S32
    with pytest.raises(CompileError) as err:  # NaN is no s32
        simulate_program(integers, {"arg0": np.zeros((128, 64), np.int32)}, check_races=False)
    assert err.value.code == "E603" and "fill nan" in err.value.message


def _run(tmp_path: Path, name: str, text: str, inputs: dict[str, np.ndarray], *flags: str) -> dict:
    model, arrays = tmp_path / f"{name}.hlo", tmp_path / f"{name}.in.npz"
    model.write_text(text)
    np.savez(arrays, **inputs)
    return compile_and_run(model, arrays, name, *flags)


@pytest.mark.parametrize("loops", ["unrolled", "rolled"])
def test_a_causal_softmax_gives_the_bits_of_its_mask_given_as_an_input_in_less_time(
        tmp_path: Path, loops: str) -> None:
    scores = np.random.default_rng(7).normal(0, 3, (2, 256, 384)).astype(np.float32)
    tril = np.tril(np.ones((256, 384), dtype=bool))
    built = _run(tmp_path, "built", CAUSAL, {"arg0": scores}, "--loops", loops)
    given = _run(tmp_path, "given", _masked_softmax("", mask_parameter=True), {"arg0": scores, "arg1": tril},
                 "--loops", loops)
    assert built["out0"].tobytes() == given["out0"].tobytes()
    masked = np.where(tril, scores, np.float32(-1e9))
    e = np.exp(masked - masked.max(axis=-1, keepdims=True))
    np.testing.assert_allclose(built["out0"], e / e.sum(axis=-1, keepdims=True), rtol=1e-5, atol=1e-7)
    assert built["simulated_ns"] < 0.95 * given["simulated_ns"]
