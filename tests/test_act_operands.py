"""ACT's per-partition bias operand and row sum: the activation's semantics in the simulator and the
verifier, and the Penguin pass `act_operands` that gives a softmax's x − max and sum of exp to it,
checked on lowered programs and end to end from the CLI (the same outputs bit for bit, less time)."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
from sim_builders import ACT, DVE, SP, hbm_2d, onchip
from test_penguin_opt import CHANNEL_NORM, MASKED_SOFTMAX, lowered, masked_softmax_runs, runs_with_and_without
from walrus_builders import Bir, run_passes

from ncc.schemas import bir_pb2
from ncc.tools.common.errors import CompileError
from ncc.tools.hlo_opt.bir_codegen import lower_to_bir
from ncc.tools.hlo_opt.optimizer import optimize, pass_list
from ncc.tools.hlo_opt.passes.act_operands import fold_act_operands
from ncc.tools.sim import simulate_program
from ncc.tools.walrus_driver.pass_manager import DEFAULT_PASSES

WITHOUT = [p for p in pass_list("", 2) if p != "act_operands"]


def _exp_program(
    fold: bool, bias_dims: list[bir_pb2.Dim] | None = None, sum_cols: int = 1
) -> bir_pb2.Program:
    """out0 = exp(x − m) for x [128, 64] and m [128, 1], out1 = its row sums: with `fold` one
    activation does it all, else a DVE subtract, the exp and a DVE reduce."""
    b = Bir("exp_of_shift")
    b.hbm("x", [128, 64], index=0)
    b.hbm("m", [128, 1], index=1)
    b.hbm("e", [128, 64], role=bir_pb2.OUTPUT, index=0)
    b.hbm("s", [128, 1], role=bir_pb2.OUTPUT, index=1)
    for name, cols in (("sx", 64), ("sm", 1), ("neg", 2), ("shift", 64), ("se", 64), ("ss", sum_cols)):
        b.buffer(name, cols * 4)
    b.add("dma", SP, [onchip("sx", 128, 64)], [hbm_2d("x", 128, 64)], queue=0)
    b.add("dma", SP, [onchip("sm", 128, 1)], [hbm_2d("m", 128, 1)], queue=1)
    spread = bir_pb2.AccessPattern()
    spread.CopyFrom(onchip("sm", 128, 1))
    del spread.dims[:]
    spread.dims.add(stride=0, count=64)
    if fold:
        b.add(
            "tensor_scalar",
            DVE,
            [onchip("neg", 128, 1)],
            [onchip("sm", 128, 1)],
            func="multiply",
            scalars=[-1],
        )
        bias = onchip("neg", 128, 1)
        bias.ClearField("dims")
        bias.dims.extend(bias_dims or [bir_pb2.Dim(stride=0, count=64)])
        b.add(
            "activation",
            ACT,
            [onchip("se", 128, 64), onchip("ss", 128, sum_cols)],
            [onchip("sx", 128, 64), bias],
            name="exp",
            func="exp",
            scalars=[1, 0],
        )
    else:
        b.add(
            "tensor_tensor", DVE, [onchip("shift", 128, 64)], [onchip("sx", 128, 64), spread], func="subtract"
        )
        b.add(
            "activation", ACT, [onchip("se", 128, 64)], [onchip("shift", 128, 64)], func="exp", scalars=[1, 0]
        )
        b.add("tensor_reduce", DVE, [onchip("ss", 128, 1)], [onchip("se", 128, 64)], func="add")
    b.add("dma", SP, [hbm_2d("e", 128, 64)], [onchip("se", 128, 64)], queue=2)
    b.add("dma", SP, [hbm_2d("s", 128, 1)], [onchip("ss", 128, 1)], queue=3)
    return b.build()


def _exp_inputs() -> dict[str, np.ndarray]:
    rng = np.random.default_rng(5)
    x = rng.normal(0, 3, (128, 64)).astype(np.float32)
    x[0, :4] = [0.0, -0.0, np.inf, -np.inf]
    return {"arg0": x, "arg1": x.max(axis=1, keepdims=True)}


def test_the_activation_s_bias_and_sum_give_what_dve_gave_bit_for_bit() -> None:
    """Both forms through every walrus pass (the verifier after each), then simulated."""
    inputs = _exp_inputs()
    results = {}
    for fold in (True, False):
        ctx = run_passes(_exp_program(fold), ",".join(DEFAULT_PASSES))
        results[fold] = simulate_program(ctx.program, inputs)
        assert results[fold].races == [] and results[fold].deadlock is None
    folded, apart = results[True], results[False]
    for name in ("out0", "out1"):
        assert np.array_equal(folded.outputs[name], apart.outputs[name], equal_nan=True)
    with np.errstate(invalid="ignore"):
        expected = np.exp(inputs["arg0"] - inputs["arg1"])
    assert np.array_equal(folded.outputs["out0"][1:], expected[1:])
    assert np.isnan(folded.outputs["out0"][0, 2]) and folded.outputs["out0"][0, 3] == 0
    assert folded.engine_busy_ns["DVE"] < 0.5 * apart.engine_busy_ns["DVE"]


@pytest.mark.parametrize(
    "case, message",
    [
        ("bias_walks", "one element per partition"),
        ("sum_too_wide", "the sum (output 1)"),
    ],
)
def test_a_malformed_bias_or_sum_is_refused_by_the_simulator_and_the_verifier(
    case: str, message: str
) -> None:
    if case == "bias_walks":
        program = _exp_program(
            True, bias_dims=[bir_pb2.Dim(stride=0, count=32), bir_pb2.Dim(stride=1, count=2)]
        )
    else:
        program = _exp_program(True, sum_cols=2)
    with pytest.raises(CompileError) as err:
        simulate_program(program, _exp_inputs(), check_races=False)
    assert err.value.code == "E603" and message in err.value.message and "'exp'" in err.value.message
    _refused_by_the_verifier(program, "element_count: exp")


def _refused_by_the_verifier(program: bir_pb2.Program, what: str) -> None:
    run_passes(_exp_program(True), "birverifier", verify_each=False)  # the well-formed one passes
    with pytest.raises(CompileError) as err:
        run_passes(program, "birverifier", verify_each=False)
    assert err.value.code == "E410" and err.value.message.startswith(f"birverifier: {what}"), (
        err.value.message
    )


def test_an_operand_no_act_operand_names_is_an_error() -> None:
    """A third input needs act_operand = scale_bias to name it; a fourth is past any."""
    program = _exp_program(True)
    exp = next(i for i in program.instructions if i.name == "exp")
    exp.inputs.append(exp.inputs[1])
    with pytest.raises(CompileError, match="act_operand 'bias' does not name its 2 operand"):
        simulate_program(program, _exp_inputs(), check_races=False)
    _refused_by_the_verifier(program, "element_count: exp: act_operand 'bias' does not name its 2 operand")
    exp.inputs.append(exp.inputs[1])
    with pytest.raises(CompileError, match="activation takes 1 to 3 inputs"):
        simulate_program(program, _exp_inputs(), check_races=False)
    _refused_by_the_verifier(program, "operand_count: exp: activation takes 1 to 3 inputs")


def _softmax_nest(program):
    return next(n for n in program.nests if any(st.op == "activation" for st in n.statements))


def test_a_softmax_s_shift_and_sum_join_its_exp() -> None:
    program = lowered(MASKED_SOFTMAX)
    optimize(program, pass_list("", 2))
    nest = _softmax_nest(program)
    ops = [(st.op, st.func) for st in nest.statements]
    assert ("tensor_tensor", "subtract") not in ops and ops.count(("tensor_reduce", "add")) == 0
    assert ("tensor_scalar", "multiply") in ops  # the [P, 1] tile's negation
    exp = next(st for st in nest.statements if st.op == "activation")
    assert len(exp.inputs) == 2 and len(exp.outputs) == 2 and exp.attributes["broadcast"] == "1"
    bir = lower_to_bir(program)
    act = next(i for i in bir.instructions if i.op == "activation")
    assert [(d.stride, d.count) for d in act.inputs[1].dims] == [(0, 512)]
    assert act.outputs[1].partition_count == 128 and [d.count for d in act.outputs[1].dims] == [1]


LAYER_NORM = """HloModule norm
ADD { a = f32[] parameter(0)  b = f32[] parameter(1)  ROOT s = f32[] add(a, b) }
ENTRY main {
  x = f32[256,512] parameter(0)
  zero = f32[] constant(0)
  sum = f32[256] reduce(x, zero), dimensions={1}, to_apply=ADD
  n = f32[] constant(0.001953125)
  nb = f32[256] broadcast(n), dimensions={}
  mean = f32[256] multiply(sum, nb)
  meanb = f32[256,512] broadcast(mean), dimensions={0}
  d = f32[256,512] subtract(x, meanb)
  sq = f32[256,512] multiply(d, d)
  ss = f32[256] reduce(sq, zero), dimensions={1}, to_apply=ADD
  var = f32[256] multiply(ss, nb)
  eps = f32[] constant(1e-5)
  epsb = f32[256] broadcast(eps), dimensions={}
  ve = f32[256] add(var, epsb)
  r = f32[256] rsqrt(ve)
  rb = f32[256,512] broadcast(r), dimensions={0}
  ROOT y = f32[256,512] multiply(d, rb)
}
"""


def test_a_shift_that_another_statement_reads_stays_on_dve() -> None:
    """A norm's x − mean feeds the square and the scaling: the subtract stays a statement of its
    own (on DVE, or on ACT as an identity activation when DVE is the busier); nothing folds into
    a square that is a DVE multiply."""
    program = lowered(LAYER_NORM)
    optimize(program, WITHOUT)
    stats = fold_act_operands(program)
    assert stats.biases_folded == 0
    assert any(
        st.func == "subtract" or st.op == "activation" and st.func == "identity" and len(st.inputs) == 2
        for n in program.nests for st in n.statements
    )


def test_an_exp_with_a_scale_keeps_its_shift() -> None:
    """exp(2·(x − m)) is not exp(2·x − 2·m) bit for bit: the subtract stays a statement of its own
    (the exp reads its one input); the sum still folds."""
    program = lowered(MASKED_SOFTMAX)
    optimize(program, WITHOUT)
    exp = next(st for st in _softmax_nest(program).statements if st.op == "activation")
    del exp.scalars[:]
    exp.scalars.extend([2.0, 0.0])
    stats = fold_act_operands(program)
    assert (stats.biases_folded, stats.sums_folded) == (0, 1)
    (exp,) = [st for st in _softmax_nest(program).statements if st.op == "activation" and st.func == "exp"]
    assert len(exp.inputs) == 1 and list(exp.scalars) == [2.0, 0.0]


@pytest.mark.slow
def test_folded_softmax_verifies_from_the_cli_with_the_same_outputs_in_less_time(tmp_path: Path) -> None:
    runs = masked_softmax_runs(tmp_path, "act_operands", seed=9)
    folded, apart = runs["with"], runs["without"]
    assert np.array_equal(folded["out0"], apart["out0"])
    assert folded["engine_busy_ns"]["DVE"] < 0.8 * apart["engine_busy_ns"]["DVE"]
    assert folded["simulated_ns"] < apart["simulated_ns"]


# CHANNEL_NORM with its + beta: (x − mean) · scale + beta over channel-major tiles, each vector a
# [P, 1] column; four DVE passes a tile as lowered.
CHANNEL_NORM_BETA = CHANNEL_NORM.replace("ROOT y =", "y =").replace(
    "  scale = f32[64] parameter(2)\n", "  scale = f32[64] parameter(2)\n  beta = f32[64] parameter(3)\n"
).removesuffix("}\n") + """  b = f32[4,28,28,64] broadcast(beta), dimensions={3}
  ROOT z = f32[4,28,28,64] add(y, b)
}
"""


def test_a_norm_s_column_shifts_move_to_act_while_dve_is_busier() -> None:
    """DVE would compute the subtract, the multiply and the add; the subtract (of the negated
    mean) and the add go to ACT as identity activations with a [P, 1] bias, the multiply stays."""
    program = lowered(CHANNEL_NORM_BETA)
    optimize(program, pass_list("", 2))
    (nest,) = program.nests
    computes = {(st.op, st.func) for st in nest.statements if st.op != "dma"}
    assert ("tensor_tensor", "multiply") in computes
    shifts = [st for st in nest.statements if st.op == "activation"]
    assert [st.func for st in shifts] == ["identity", "identity"]
    for st in shifts:
        assert st.attributes["broadcast"] == "1" and st.inputs[1].extents[-1] == 1
    negations = [st for st in nest.statements if st.op == "tensor_scalar" and list(st.scalars) == [-1.0]]
    assert len(negations) == 1 and negations[0].outputs[0].extents[-1] == 1


CHANNEL_NORM_RELU = CHANNEL_NORM_BETA.replace("ROOT z =", "z =").removesuffix("}\n") + """
  zero = f32[] constant(0)
  zeros = f32[4,28,28,64] broadcast(zero), dimensions={}
  ROOT r = f32[4,28,28,64] maximum(z, zeros)
}
"""


def test_a_relu_after_a_moved_shift_becomes_its_function() -> None:
    """The + beta moves to ACT, and the max(·, 0) that alone reads it becomes its relu."""
    program = lowered(CHANNEL_NORM_RELU)
    optimize(program, pass_list("", 2))
    (nest,) = program.nests
    assert [st.func for st in nest.statements if st.op == "activation"] == ["identity", "relu"]
    assert not [st for st in nest.statements if st.func == "maximum"]
    store = [st for st in nest.statements if st.op == "dma"][-1]
    relu = next(st for st in nest.statements if st.func == "relu")
    assert store.inputs[0].tensor == relu.outputs[0].tensor


@pytest.mark.slow
def test_moved_shifts_verify_from_the_cli_with_the_same_values_in_less_time(tmp_path: Path) -> None:
    rng = np.random.default_rng(6)
    inputs = {"arg0": rng.normal(0, 2, (4, 28, 28, 64)).astype(np.float32),
              "arg1": rng.normal(0, 1, 64).astype(np.float32),
              "arg2": rng.normal(1, 0.1, 64).astype(np.float32),
              "arg3": rng.normal(0, 1, 64).astype(np.float32)}
    runs = runs_with_and_without(tmp_path, CHANNEL_NORM_RELU, inputs, "act_operands")
    moved, apart = runs["with"], runs["without"]
    assert np.array_equal(moved["out0"], apart["out0"])  # equal values (a −0 may come out +0)
    assert moved["engine_busy_ns"]["DVE"] < 0.7 * apart["engine_busy_ns"]["DVE"]
    assert moved["simulated_ns"] < apart["simulated_ns"]


SCALED_PRODUCT = """HloModule scaled_product
ENTRY main {
  x = f32[256,512] parameter(0)
  z = f32[256,512] parameter(1)
  c = f32[] constant(8)
  cb = f32[256,512] broadcast(c), dimensions={}
  s = f32[256,512] divide(x, cb)
  p = f32[256,512] multiply(s, z)
  ROOT out = (f32[256,512], f32[256,512]) tuple(s, p)
}
"""


@pytest.mark.slow
def test_a_scaling_gives_its_bits_on_whichever_engine_runs_it(tmp_path: Path) -> None:
    """x / 8 beside a product on DVE: the backend may run the divide on ACT as x * 0.125 + (-0)
    (engine_choice), which gives the divide's bits, -0 and subnormals included (its bias was +0
    once, and a -0 came out +0)."""
    rng = np.random.default_rng(12)
    x = rng.normal(0, 1e3, (256, 512)).astype(np.float32)
    x.flat[:8] = [0.0, -0.0, 1e-40, -1e-40, 3e-38, -3e-38, 3.4e38, -np.inf]
    inputs = {"arg0": x, "arg1": rng.normal(0, 1, (256, 512)).astype(np.float32)}
    runs = runs_with_and_without(tmp_path, SCALED_PRODUCT, inputs, "act_operands")
    for run in runs.values():
        assert np.array_equal(run["out0"].view(np.uint32), (x / np.float32(8)).view(np.uint32))


def test_a_sum_of_squares_becomes_one_act_square_with_its_row_sum(models_dir: Path) -> None:
    """RMSNorm's x·x and its row sum (jax: jnp.mean(x * x)): two DVE passes, three streams, now
    ACT's square writing the sum as its second output; no DVE multiply of x by itself is left."""
    program = lowered((models_dir / "rmsnorm.hlo").read_text())
    optimize(program, pass_list("", 2))
    squares = [st for nest in program.nests for st in nest.statements if st.func == "square"]
    assert len(squares) == 1 and squares[0].op == "activation" and len(squares[0].outputs) == 2
    assert list(squares[0].scalars) == [1.0, 0.0] and len(squares[0].inputs) == 1
    for nest in program.nests:
        for st in nest.statements:
            assert not (st.op == "tensor_tensor" and st.inputs[0] == st.inputs[1]), st.name
            assert not (st.op == "tensor_reduce" and st.func == "add"), st.name


SQUARES_KEPT = """HloModule squares_kept
add {
  a = f32[] parameter(0)
  b = f32[] parameter(1)
  ROOT s = f32[] add(a, b)
}
ENTRY main {
  x = f32[128,512] parameter(0)
  sq = f32[128,512] multiply(x, x)
  zero = f32[] constant(0)
  m = f32[128] reduce(sq, zero), dimensions={1}, to_apply=add
  ROOT out = (f32[128], f32[128,512]) tuple(m, sq)
}
"""


@pytest.mark.slow
def test_squares_and_their_sums_give_the_same_bits_on_act(tmp_path: Path, models_dir: Path) -> None:
    """Row sums of x·x, where x·x is an output too: ACT's square writes both, and the sums are DVE's
    bits (zeros, subnormals, overflow and infinities among the squares). RMSNorm, the bundled
    model, runs in less time with the same output."""
    (tmp_path / "kept").mkdir()
    (tmp_path / "rmsnorm").mkdir()
    rng = np.random.default_rng(18)
    x = rng.normal(0, 10, (128, 512)).astype(np.float32)
    x.flat[:6] = [0.0, -0.0, 1e-40, -1e-25, 2e19, -np.inf]
    runs = runs_with_and_without(tmp_path / "kept", SQUARES_KEPT, {"arg0": x}, "act_operands")
    assert np.array_equal(runs["with"]["out0"].view(np.uint32), runs["without"]["out0"].view(np.uint32))
    assert runs["with"]["engine_busy_ns"]["DVE"] < runs["without"]["engine_busy_ns"]["DVE"]
    with np.load(models_dir / "rmsnorm.io.npz") as io:
        inputs = {name: io[name] for name in io.files if name.startswith("arg")}
    runs = runs_with_and_without(tmp_path / "rmsnorm", (models_dir / "rmsnorm.hlo").read_text(), inputs,
                                 "act_operands")
    assert np.array_equal(runs["with"]["out0"], runs["without"]["out0"])
    assert runs["with"]["simulated_ns"] < runs["without"]["simulated_ns"]
