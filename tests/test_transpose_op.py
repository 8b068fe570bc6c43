"""BIR `transpose` on PE: out[f, p] = in0[p, f] into PSUM, bit for bit (docs/ir.md), priced like a
matmul against an identity, and held to its shape rules by the simulator and the verifier."""

from __future__ import annotations

import numpy as np
import pytest
from walrus_builders import ACT, PE, PSUM, SBUF, Bir, run_passes, tile

from ncc.schemas import bir_pb2
from ncc.tools.common.errors import CompileError
from ncc.tools.sim.api import simulate_program
from ncc.tools.target import load_target
from ncc.tools.target.costs import engine_cycles
from ncc.tools.walrus_driver.pass_manager import default_pipeline


def _transpose_program(
    p: int, f: int, out_partitions: int | None = None, into: int = PSUM
) -> bir_pb2.Program:
    """x [p, f] from HBM, transposed on PE into PSUM, copied to SBUF by ACT, stored as out [f, p]."""
    b = Bir("transpose")
    b.hbm("x", [p, f])
    b.hbm("out", [f, p], role=bir_pb2.OUTPUT)
    b.buffer("xt", 4 * f)
    b.buffer("t", 4 * p, memory=into)
    b.buffer("o", 4 * p)
    b.load("xt", "x", p, f, name="load")
    transposed = tile("t", out_partitions or f, p, memory=into)
    b.add("transpose", PE, [transposed], [tile("xt", p, f)], name="transpose")
    b.add("tensor_copy", ACT, [tile("o", f, p)], [tile("t", f, p, memory=into)], name="evacuate")
    b.store("out", "o", f, p, name="store")
    return b.build()


def test_a_transpose_of_finite_values_is_exact():
    x = (np.arange(96 * 40, dtype=np.float32).reshape(96, 40) - 1000) / 7
    program = _transpose_program(96, 40)
    run_passes(program, ",".join(default_pipeline(2)))
    result = simulate_program(program, {"arg0": x})
    assert not result.races and result.deadlock is None
    assert result.outputs["out0"].tobytes() == np.ascontiguousarray(x.T).tobytes()


def test_a_non_finite_value_spreads_along_its_column_as_on_neuroncore_v2():
    """The PE transposes by a matmul against an identity: inf x 0 is NaN in every other element of
    the transposed row, which NKI documents as not bit-accurate on NeuronCore-v2."""
    x = np.ones((64, 32), dtype=np.float32)
    x[5, 3] = np.inf
    program = _transpose_program(64, 32)
    run_passes(program, ",".join(default_pipeline(2)))
    out = simulate_program(program, {"arg0": x}).outputs["out0"]
    assert out[3, 5] == np.inf or np.isnan(out[3, 5])
    assert np.isnan(np.delete(out[3], 5)).all()
    assert (np.delete(out, 3, axis=0) == 1).all()


def test_a_transpose_costs_what_a_matmul_against_an_identity_costs():
    """An fp32 tile of 128 partitions: the identity's 128 columns in 4 passes, as the matmul would."""
    target = load_target("trn1")
    shape = {"engine": PE, "free": 128, "moving_free": 128}
    as_matmul = engine_cycles(target, op="matmul", inputs=2, fp32=True, **shape)
    assert engine_cycles(target, op="transpose", inputs=1, fp32=True, **shape) == as_matmul
    assert engine_cycles(target, op="transpose", inputs=1, fp32=False, **shape) < as_matmul


def test_a_transpose_of_the_wrong_shape_is_refused_by_the_verifier():
    with pytest.raises(CompileError) as err:
        run_passes(_transpose_program(96, 40, out_partitions=96), "birverifier")
    assert err.value.code == "E410" and "transpose of [96,40]" in err.value.message


def test_a_transpose_into_sbuf_is_refused():
    with pytest.raises(CompileError) as err:
        run_passes(_transpose_program(64, 32, into=SBUF), "birverifier")
    assert "transpose_psum" in err.value.message and "not PSUM" in err.value.message
