"""Simulator functional semantics: hand-built BIR programs checked against numpy."""

from __future__ import annotations

import numpy as np
import pytest
from sim_builders import (
    ACT,
    BF16,
    DVE,
    F32,
    PE,
    POOL,
    PSUM,
    S32,
    SP,
    ProgramBuilder,
    find,
    hbm_2d,
    onchip,
    update,
    wait,
)

from ncc.schemas import bir_pb2, common_pb2
from ncc.tools.common import dtypes
from ncc.tools.common.errors import CompileError
from ncc.tools.sim import simulate_program

RNG = np.random.default_rng(7)


def elementwise_program() -> bir_pb2.Program:
    """x, y [128, 64] → out0 = exp(0.5·(x + y) + 0.1), out1 = row sums of out0 (8 instructions)."""
    b = ProgramBuilder("elementwise")
    b.hbm("x", [128, 64], index=0)
    b.hbm("y", [128, 64], index=1)
    b.hbm("z", [128, 64], role=bir_pb2.OUTPUT, index=0)
    b.hbm("r", [128, 1], role=bir_pb2.OUTPUT, index=1)
    for name in ("sx", "sy", "ssum", "sexp"):
        b.buffer(name, 256)
    b.buffer("sred", 4)
    b.add(
        "dma",
        SP,
        [onchip("sx", 128, 64)],
        [hbm_2d("x", 128, 64)],
        name="load_x",
        queue=0,
        updates=[update(0)],
    )
    b.add(
        "dma",
        ACT,
        [onchip("sy", 128, 64)],
        [hbm_2d("y", 128, 64)],
        name="load_y",
        queue=1,
        updates=[update(1)],
    )
    b.add(
        "tensor_tensor",
        DVE,
        [onchip("ssum", 128, 64)],
        [onchip("sx", 128, 64), onchip("sy", 128, 64)],
        name="add",
        func="add",
        waits=[wait(0, 1), wait(1, 1)],
        updates=[update(2)],
    )
    b.add(
        "activation",
        ACT,
        [onchip("sexp", 128, 64)],
        [onchip("ssum", 128, 64)],
        name="exp",
        func="exp",
        scalars=[0.5, 0.1],
        waits=[wait(2, 1)],
        updates=[update(3)],
    )
    b.add(
        "tensor_reduce",
        DVE,
        [onchip("sred", 128, 1)],
        [onchip("sexp", 128, 64)],
        name="rowsum",
        func="add",
        waits=[wait(3, 1)],
        updates=[update(4)],
    )
    b.add(
        "dma",
        SP,
        [hbm_2d("z", 128, 64)],
        [onchip("sexp", 128, 64)],
        name="store_z",
        queue=2,
        waits=[wait(3, 1)],
    )
    b.add(
        "dma",
        SP,
        [hbm_2d("r", 128, 1)],
        [onchip("sred", 128, 1)],
        name="store_r",
        queue=3,
        waits=[wait(4, 1)],
    )
    # Every count is final and every wait seen once store_r passed its wait: the inference ends
    # by zeroing the semaphores (walrus pass semaphore_reset), so the program can run again.
    b.add("sem_reset", SP, [], [], name="reset")
    return b.build()


def elementwise_inputs() -> dict[str, np.ndarray]:
    """The same inputs on every call."""
    rng = np.random.default_rng(11)
    return {
        "arg0": rng.standard_normal((128, 64)).astype(np.float32),
        "arg1": rng.standard_normal((128, 64)).astype(np.float32),
    }


def test_elementwise_matches_numpy() -> None:
    inputs = elementwise_inputs()
    result = simulate_program(elementwise_program(), inputs)
    expected = np.exp((inputs["arg0"] + inputs["arg1"]) * np.float32(0.5) + np.float32(0.1))
    np.testing.assert_allclose(result.outputs["out0"], expected, rtol=1e-6)
    np.testing.assert_allclose(result.outputs["out1"][:, 0], expected.sum(axis=1), rtol=1e-5)
    assert result.races == [] and result.deadlock is None
    assert result.instruction_count == 8
    assert result.outputs["out0"].dtype == np.float32


def matmul_program(dtype: int, k: int = 256, m: int = 64, n: int = 96) -> bir_pb2.Program:
    """out0 [m, n] = a[k, m]ᵀ · b[k, n], K split in 128-row chunks accumulated in PSUM."""
    b = ProgramBuilder("matmul")
    b.hbm("a", [k, m], dtype=dtype, index=0)
    b.hbm("b", [k, n], dtype=dtype, index=1)
    b.hbm("c", [m, n], role=bir_pb2.OUTPUT, index=0)
    size = dtypes.itemsize(dtype)
    chunks = k // 128
    for i in range(chunks):
        b.buffer(f"a{i}", m * size)
        b.buffer(f"b{i}", n * size)
        b.add(
            "dma",
            SP,
            [onchip(f"a{i}", 128, m, dtype)],
            [hbm_2d("a", 128, m, dtype, row0=128 * i)],
            name=f"load_a{i}",
            queue=2 * i,
            updates=[update(i)],
        )
        b.add(
            "dma",
            ACT,
            [onchip(f"b{i}", 128, n, dtype)],
            [hbm_2d("b", 128, n, dtype, row0=128 * i)],
            name=f"load_b{i}",
            queue=2 * i + 1,
            updates=[update(i)],
        )
    b.buffer("acc", n * 4, memory=PSUM)
    b.buffer("res", n * 4)
    done = chunks
    for i in range(chunks):
        b.add(
            "matmul",
            PE,
            [onchip("acc", m, n, F32, memory=PSUM)],
            [onchip(f"a{i}", 128, m, dtype), onchip(f"b{i}", 128, n, dtype)],
            name=f"mm{i}",
            accumulate=i > 0,
            waits=[wait(i, 2)],
            updates=[update(done)] if i == chunks - 1 else [],
        )
    b.add(
        "tensor_copy",
        DVE,
        [onchip("res", m, n)],
        [onchip("acc", m, n, memory=PSUM)],
        name="evacuate",
        waits=[wait(done, 1)],
        updates=[update(done + 1)],
    )
    b.add(
        "dma",
        SP,
        [hbm_2d("c", m, n)],
        [onchip("res", m, n)],
        name="store",
        queue=5,
        waits=[wait(done + 1, 1)],
    )
    return b.build()


@pytest.mark.parametrize("dtype", [F32, BF16])
def test_matmul_accumulates_in_psum(dtype: int) -> None:
    a = RNG.standard_normal((256, 64)).astype(np.float32)
    bm = RNG.standard_normal((256, 96)).astype(np.float32)
    if dtype == BF16:  # the user gives bf16 values widened to f32
        a, bm = dtypes.bf16_to_f32(dtypes.f32_to_bf16(a)), dtypes.bf16_to_f32(dtypes.f32_to_bf16(bm))
    result = simulate_program(matmul_program(dtype), {"arg0": a, "arg1": bm})
    expected = a.astype(np.float64).T @ bm.astype(np.float64)
    np.testing.assert_allclose(result.outputs["out0"], expected, rtol=1e-4, atol=1e-4)
    assert not result.races and result.deadlock is None


def test_bf16_matmul_is_faster_than_fp32() -> None:
    inputs = {"arg0": np.ones((256, 64), np.float32), "arg1": np.ones((256, 96), np.float32)}
    fp32 = simulate_program(matmul_program(F32), inputs)
    bf16 = simulate_program(matmul_program(BF16), inputs)
    assert bf16.engine_busy_ns["PE"] < fp32.engine_busy_ns["PE"]


def test_iota_select_tensor_scalar_and_bf16_copy() -> None:
    b = ProgramBuilder("pool")
    b.hbm("x", [128, 16], index=0)
    b.hbm("sel", [128, 16], role=bir_pb2.OUTPUT, index=0)
    b.hbm("rev", [128, 16], dtype=S32, role=bir_pb2.OUTPUT, index=1)
    b.hbm("half", [128, 16], dtype=BF16, role=bir_pb2.OUTPUT, index=2)
    for name in ("sx", "mask", "sel_sb"):
        b.buffer(name, 64)
    b.buffer("iota", 64)
    b.buffer("rev_sb", 64)
    b.buffer("half_sb", 32)
    b.add("dma", SP, [onchip("sx", 128, 16)], [hbm_2d("x", 128, 16)], name="load", updates=[update(0)])
    b.add(
        "iota", POOL, [onchip("iota", 128, 16, S32)], [], name="iota", scalars=[0, 16, 1], updates=[update(1)]
    )
    # DVE waits for POOL's iota on a drain: waiting on "mask" itself would hold the SBUF port
    # that the iota needs (the port is claimed at dispatch)
    b.add("drain", DVE, [], [], name="mask.drain", waits=[wait(1, 1)])
    b.add(
        "tensor_scalar",
        DVE,
        [onchip("mask", 128, 16)],
        [onchip("iota", 128, 16, S32)],
        name="mask",
        func="ge",
        scalars=[1000],
        updates=[update(2)],
    )
    b.add(
        "tensor_scalar",
        DVE,
        [onchip("rev_sb", 128, 16, S32)],
        [onchip("iota", 128, 16, S32)],
        name="reverse",
        func="subtract",
        scalars=[2048],
        attributes={"reverse": "1"},
        updates=[update(2)],
    )
    b.add("drain", POOL, [], [], name="select.drain", waits=[wait(2, 2)])  # DVE's work needs the port
    b.add(
        "select",
        POOL,
        [onchip("sel_sb", 128, 16)],
        [onchip("mask", 128, 16), onchip("sx", 128, 16), onchip("iota", 128, 16, S32)],
        name="select",
        waits=[wait(0, 1)],
        updates=[update(3)],
    )
    b.add(
        "tensor_copy",
        ACT,
        [onchip("half_sb", 128, 16, BF16)],
        [onchip("sx", 128, 16)],
        name="to_bf16",
        waits=[wait(0, 1)],
        updates=[update(4)],
    )
    b.add(
        "dma",
        SP,
        [hbm_2d("sel", 128, 16)],
        [onchip("sel_sb", 128, 16)],
        name="store_sel",
        queue=1,
        waits=[wait(3, 1)],
    )
    b.add(
        "dma",
        SP,
        [hbm_2d("rev", 128, 16, S32)],
        [onchip("rev_sb", 128, 16, S32)],
        name="store_rev",
        queue=2,
        waits=[wait(2, 2)],
    )
    b.add(
        "dma",
        SP,
        [hbm_2d("half", 128, 16, BF16)],
        [onchip("half_sb", 128, 16, BF16)],
        name="store_half",
        queue=3,
        waits=[wait(4, 1)],
    )
    x = RNG.standard_normal((128, 16)).astype(np.float32)
    result = simulate_program(b.build(), {"arg0": x})
    index = np.arange(128)[:, None] * 16 + np.arange(16)[None, :]
    np.testing.assert_array_equal(
        result.outputs["out0"], np.where(index >= 1000, x, index.astype(np.float32))
    )
    np.testing.assert_array_equal(result.outputs["out1"], 2048 - index)
    assert result.outputs["out1"].dtype == np.int32
    np.testing.assert_array_equal(result.outputs["out2"], dtypes.bf16_to_f32(dtypes.f32_to_bf16(x)))
    assert result.outputs["out2"].dtype == np.float32
    assert not result.races and result.deadlock is None


def test_constants_and_strided_broadcast_access() -> None:
    """A CONSTANT [1, 8] read through a stride-0 HBM dim lands in 4 partitions."""
    b = ProgramBuilder("const")
    bias = np.arange(8, dtype=np.float32)
    b.hbm("bias", [1, 8], role=bir_pb2.CONSTANT, data=bias.reshape(1, 8))
    b.hbm("out", [4, 8], role=bir_pb2.OUTPUT, index=0)
    b.buffer("sb", 32)
    broadcast = bir_pb2.AccessPattern(
        memory=common_pb2.HBM,
        tensor="bias",
        dtype=F32,
        dims=[bir_pb2.Dim(stride=0, count=4), bir_pb2.Dim(stride=1, count=8)],
    )
    b.add("dma", SP, [onchip("sb", 4, 8)], [broadcast], name="load", updates=[update(0)])
    b.add("dma", SP, [hbm_2d("out", 4, 8)], [onchip("sb", 4, 8)], name="store", waits=[wait(0, 1)])
    result = simulate_program(b.build(), {})
    np.testing.assert_array_equal(result.outputs["out0"], np.tile(bias, (4, 1)))


def test_unallocated_buffers_get_private_storage() -> None:
    program = elementwise_program()
    for buffer in program.buffers:
        buffer.address = -1
    inputs = elementwise_inputs()
    result = simulate_program(program, inputs)
    expected = np.exp((inputs["arg0"] + inputs["arg1"]) * np.float32(0.5) + np.float32(0.1))
    np.testing.assert_allclose(result.outputs["out0"], expected, rtol=1e-6)
    assert not result.races


def test_streams_are_used_when_present() -> None:
    program = elementwise_program()
    grouped: dict[int, bir_pb2.Stream] = {}
    for instruction in program.instructions:
        if instruction.engine not in grouped:
            grouped[instruction.engine] = program.streams.add(engine=instruction.engine)
        grouped[instruction.engine].instructions.append(instruction)
    del program.instructions[:]
    inputs = elementwise_inputs()
    result = simulate_program(program, inputs)
    assert result.instruction_count == 8
    np.testing.assert_allclose(
        result.outputs["out1"][:, 0],
        np.exp((inputs["arg0"] + inputs["arg1"]) * 0.5 + 0.1).sum(axis=1),
        rtol=1e-5,
    )


def test_missing_input_is_e602() -> None:
    with pytest.raises(CompileError) as err:
        simulate_program(elementwise_program(), {"arg0": np.zeros((128, 64), np.float32)})
    assert err.value.code == "E602" and "arg1" in err.value.message


def test_wrong_shape_input_is_e602() -> None:
    inputs = elementwise_inputs()
    inputs["arg0"] = np.zeros((64, 128), np.float32)
    with pytest.raises(CompileError) as err:
        simulate_program(elementwise_program(), inputs)
    assert err.value.code == "E602" and "arg0" in err.value.message and "[64, 128]" in err.value.message


def test_out_of_bounds_access_is_e601_naming_the_instruction() -> None:
    program = elementwise_program()
    find(program, "add").outputs[0].dims[0].count = 65  # 260 bytes in a 256-byte buffer
    with pytest.raises(CompileError) as err:
        simulate_program(program, elementwise_inputs())
    assert err.value.code == "E601" and "'add'" in err.value.message


def test_out_of_bounds_hbm_access_is_e601() -> None:
    program = elementwise_program()
    find(program, "load_x").inputs[0].offset = 1
    with pytest.raises(CompileError) as err:
        simulate_program(program, elementwise_inputs())
    assert err.value.code == "E601" and "'load_x'" in err.value.message and "'x'" in err.value.message


def test_pool_cannot_touch_psum() -> None:
    b = ProgramBuilder()
    b.buffer("ps", 64, memory=PSUM)
    b.add("iota", POOL, [onchip("ps", 128, 16, memory=PSUM)], [], name="bad_iota", scalars=[0, 1, 1])
    with pytest.raises(CompileError) as err:
        simulate_program(b.build(), {})
    assert err.value.code == "E603" and "POOL cannot access PSUM" in err.value.message


def test_engine_rules_and_unknown_operands() -> None:
    b = ProgramBuilder()
    b.buffer("sb", 64)
    b.add("activation", DVE, [onchip("sb", 128, 16)], [onchip("sb", 128, 16)], name="act_on_dve", func="exp")
    with pytest.raises(CompileError) as err:
        simulate_program(b.build(), {})
    assert err.value.code == "E603" and "'act_on_dve'" in err.value.message

    b = ProgramBuilder()
    b.add("tensor_copy", DVE, [onchip("nowhere", 128, 16)], [onchip("nowhere", 128, 16)], name="copy")
    with pytest.raises(CompileError) as err:
        simulate_program(b.build(), {})
    assert err.value.code == "E603" and "nowhere" in err.value.message


def test_integer_arithmetic_and_comparisons() -> None:
    b = ProgramBuilder("ints")
    b.hbm("a", [2, 4], dtype=S32, index=0)
    b.hbm("b", [2, 4], dtype=S32, index=1)
    for i in range(4):
        b.hbm(f"o{i}", [2, 4], dtype=S32, role=bir_pb2.OUTPUT, index=i)
        b.buffer(f"r{i}", 16)
    b.buffer("sa", 16)
    b.buffer("sb", 16)
    b.add("dma", SP, [onchip("sa", 2, 4, S32)], [hbm_2d("a", 2, 4, S32)], updates=[update(0)])
    b.add("dma", SP, [onchip("sb", 2, 4, S32)], [hbm_2d("b", 2, 4, S32)], updates=[update(0)])
    for i, func in enumerate(("divide", "lt", "maximum", "and")):
        b.add(
            "tensor_tensor",
            DVE,
            [onchip(f"r{i}", 2, 4, S32)],
            [onchip("sa", 2, 4, S32), onchip("sb", 2, 4, S32)],
            func=func,
            waits=[wait(0, 2)],
            updates=[update(1)],
        )
        b.add("dma", SP, [hbm_2d(f"o{i}", 2, 4, S32)], [onchip(f"r{i}", 2, 4, S32)], waits=[wait(1, i + 1)])
    a = np.array([[7, -7, 6, 0], [5, 12, -9, 3]], np.int32)
    c = np.array([[2, 2, -4, 5], [0, 5, 4, 6]], np.int32)
    out = simulate_program(b.build(), {"arg0": a, "arg1": c}).outputs
    np.testing.assert_array_equal(out["out0"], [[3, -3, -1, 0], [-1, 2, -2, 0]])
    np.testing.assert_array_equal(out["out1"], (a < c).astype(np.int32))
    np.testing.assert_array_equal(out["out2"], np.maximum(a, c))
    np.testing.assert_array_equal(out["out3"], a & c)
