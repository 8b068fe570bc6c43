"""act_functions: chains that compute an ACT function of one tile become one activation of it. The
tanh approximation of gelu, as JAX writes it, becomes `gelu_apprx_tanh` with the same bits; the
exact gelu, as XLA expands JAX's erfc (BERT's layer), becomes `gelu`; chains that differ in any
way that matters stay as they are."""

from __future__ import annotations

import math
from pathlib import Path

import numpy as np
import pytest
from conftest import run_ncc

from ncc.schemas import bir_pb2, common_pb2, penguin_pb2
from ncc.tools.common.alu import ACT_FUNCTIONS
from ncc.tools.hlo.hlo_text import parse_hlo_text
from ncc.tools.hlo2penguin.lower import lower_module
from ncc.tools.hlo_opt.optimizer import optimize, pass_list
from ncc.tools.hlo_opt.passes.act_functions import select_act_functions


def gelu_hlo(
    shape: str = "f32[300,700]",
    cube_coeff: str = "0.044715",
    swap: bool = False,
    tanh_is_output: bool = False,
) -> str:
    """gelu(x) as jax.nn.gelu(approximate=True) lowers it; `swap` writes every product and sum
    with its operands the other way round."""
    dtype = shape.split("[")[0]

    def op(name: str, a: str, b: str) -> str:
        return f"{name}({b}, {a})" if swap else f"{name}({a}, {b})"

    root = f"(f32[{shape.split('[')[1]}, f32[{shape.split('[')[1]})" if tanh_is_output else shape
    lines = [
        "HloModule gelu",
        "ENTRY main {",
        f"  x = {shape} parameter(0)",
        f"  c0 = {dtype}[] constant({cube_coeff})",
        f"  c1 = {dtype}[] constant(0.797884583)",
        f"  c2 = {dtype}[] constant(1)",
        f"  c3 = {dtype}[] constant(0.5)",
        f"  b0 = {shape} broadcast(c0), dimensions={{}}",
        f"  b1 = {shape} broadcast(c1), dimensions={{}}",
        f"  b2 = {shape} broadcast(c2), dimensions={{}}",
        f"  b3 = {shape} broadcast(c3), dimensions={{}}",
        f"  sq = {shape} multiply(x, x)",
        f"  cu = {shape} {op('multiply', 'sq', 'x')}",
        f"  m0 = {shape} {op('multiply', 'cu', 'b0')}",
        f"  a0 = {shape} {op('add', 'x', 'm0')}",
        f"  m1 = {shape} {op('multiply', 'a0', 'b1')}",
        f"  t = {shape} tanh(m1)",
        f"  a1 = {shape} {op('add', 't', 'b2')}",
        f"  m2 = {shape} {op('multiply', 'a1', 'b3')}",
        f"  y = {shape} {op('multiply', 'x', 'm2')}",
        f"  ROOT out = {root} tuple(y, t)" if tanh_is_output else f"  ROOT out = {shape} copy(y)",
        "}",
    ]
    return "\n".join(lines) + "\n"


def optimized(text: str, passes: list[str]) -> penguin_pb2.Program:
    program = lower_module(parse_hlo_text(text))
    optimize(program, passes, num_stages=None)
    return program


def statements(program: penguin_pb2.Program) -> list[penguin_pb2.Statement]:
    return [st for nest in program.nests for st in nest.statements]


def gelu_activations(program: penguin_pb2.Program) -> int:
    return sum(st.op == "activation" and st.func == "gelu_apprx_tanh" for st in statements(program))


def test_the_gelu_chain_becomes_one_activation_and_its_dve_work_goes() -> None:
    program = optimized(gelu_hlo(), ["fusion", "cse", "act_functions", "dce"])
    assert gelu_activations(program) == 1
    computed = [st for st in statements(program) if st.op != "dma"]
    assert [(st.op, st.engine) for st in computed] == [("activation", common_pb2.ACT)]


def test_products_and_sums_written_the_other_way_round_match_too() -> None:
    assert gelu_activations(optimized(gelu_hlo(swap=True), ["fusion", "cse", "act_functions", "dce"])) == 1


@pytest.mark.parametrize(
    "text",
    [gelu_hlo(cube_coeff="0.04472"), gelu_hlo(shape="bf16[300,700]")],
    ids=["another-constant", "bf16-rounds-every-step"],
)
def test_a_chain_that_computes_something_else_is_left_alone(text: str) -> None:
    program = optimized(text, ["fusion", "cse", "act_functions", "dce"])
    assert gelu_activations(program) == 0
    assert any(st.func == "tanh" for st in statements(program))


def test_an_intermediate_that_is_also_an_output_is_still_computed() -> None:
    program = optimized(gelu_hlo(tanh_is_output=True), ["fusion", "cse", "act_functions", "dce"])
    assert gelu_activations(program) == 1
    assert any(st.func == "tanh" for st in statements(program))


def test_unfused_nests_are_not_matched_across_hbm() -> None:
    program = lower_module(parse_hlo_text(gelu_hlo()))
    assert select_act_functions(program).activations == 0


def test_the_function_is_the_nine_float32_operations_bit_for_bit() -> None:
    x = np.random.default_rng(0).normal(0, 4, 100_000).astype(np.float32)
    x = np.concatenate([x, np.array([0.0, -0.0, 1e-30, -1e-30, 20.0, -20.0, 3e12, -3e12], np.float32)])
    cube = (x * x) * x
    m = (x + cube * np.float32(0.044715)) * np.float32(0.797884583)
    expected = x * ((np.tanh(m) + np.float32(1)) * np.float32(0.5))
    got = ACT_FUNCTIONS["gelu_apprx_tanh"](x)
    assert got.dtype == np.float32
    assert np.array_equal(got.view(np.uint32), expected.view(np.uint32))


@pytest.mark.slow
def test_gelu_compiles_onto_act_verifies_and_gives_the_same_bits(tmp_path: Path) -> None:
    model = tmp_path / "gelu.hlo"
    model.write_text(gelu_hlo())
    inputs = tmp_path / "in.npz"
    np.savez(inputs, arg0=np.random.default_rng(1).normal(0, 3, (300, 700)).astype(np.float32))
    outputs = {}
    for name, flags in {"act": [], "dve": ["--penguin-passes=fusion,cse,dce,retile"]}.items():
        neff, workdir = tmp_path / f"{name}.neff", tmp_path / f"{name}.ncc-work"
        args = ["--output", str(neff), "--workdir", str(workdir), "--verify", *flags]
        done = run_ncc("compile", str(model), *args)
        assert done.returncode == 0, done.stderr
        bir = bir_pb2.Program()
        bir.ParseFromString(next(workdir.glob("*_Frontend/bir.pb")).read_bytes())
        on_act = sum(i.func == "gelu_apprx_tanh" for i in bir.instructions)
        assert (on_act > 0) == (name == "act")
        out = tmp_path / f"{name}.out.npz"
        ran = run_ncc("run", str(neff), "--inputs", str(inputs), "--output", str(out))
        assert ran.returncode == 0, ran.stderr
        outputs[name] = np.load(out)["out0"]
    assert np.array_equal(outputs["act"].view(np.uint32), outputs["dve"].view(np.uint32))


def bert_text(models_dir: Path) -> str:
    return (models_dir / "suite" / "bert_layer_cut.hlo").read_text()


def test_the_exact_gelu_as_xla_expands_erfc_becomes_one_activation(models_dir: Path) -> None:
    """BERT's feed-forward gelu, x·½·erfc(−x/√2) with XLA's rational erfc (two branches, selects,
    60 statements): one ACT `gelu`, and none of the expansion's DVE work is left."""
    program = lower_module(parse_hlo_text(bert_text(models_dir)))
    optimize(program, pass_list("", 2))
    gelus = [st for st in statements(program) if st.op == "activation" and st.func == "gelu"]
    assert len(gelus) == 1
    assert not [st for st in statements(program) if st.name.startswith("erfc.") and st.op != "dma"]


def test_an_exact_gelu_whose_halving_comes_first_becomes_one_activation_too(models_dir: Path) -> None:
    """The MoE's experts compute x·½ before the erfc chain of −x: fusion's first sweep moves the
    chain before x·½ and fuses the product into x·½, its second fuses those two, so the chain is
    one function of x again and one ACT `gelu`; after one sweep the erfc alone matched no ACT
    function and its 60 statements ran on DVE (9 of the full-size MoE's 19 ms)."""
    text = (models_dir / "suite" / "moe_ffn_cut.hlo").read_text()
    assert text.index("multiply(dot_general.4, mul.10)") < text.index("negate(dot_general.4)")
    program = lower_module(parse_hlo_text(text))
    optimize(program, pass_list("", 2))
    gelus = [st for st in statements(program) if st.op == "activation" and st.func == "gelu"]
    assert len(gelus) == 1
    assert not [st for st in statements(program) if st.name.startswith("erfc.") and st.op != "dma"]


def test_an_erfc_expansion_with_one_coefficient_changed_is_left_alone(models_dir: Path) -> None:
    text = bert_text(models_dir)
    assert text.count("constant(1.12837911)") == 1
    program = lower_module(parse_hlo_text(text.replace("constant(1.12837911)", "constant(1.1283)")))
    optimize(program, ["fusion", "cse"], num_stages=None)
    stats = select_act_functions(program)
    assert stats.functions["gelu"] == 0
    assert any(st.func == "exp" for st in statements(program))


def test_acts_gelu_is_the_exact_gelu_rounded_once() -> None:
    x = np.concatenate([np.linspace(-10, 10, 2001), [0.0, 1e-30, -1e-30, 40.0, -40.0, np.inf, -np.inf]])
    got = ACT_FUNCTIONS["gelu"](x.astype(np.float32))
    expected = [0.5 * v * math.erfc(-v / math.sqrt(2)) if math.isfinite(v) else (v if v > 0 else -0.0)
                for v in x.astype(np.float32).astype(np.float64)]
    assert got.dtype == np.float32
    assert np.array_equal(got, np.array(expected, dtype=np.float32))


def test_a_chain_that_only_changes_the_sign_of_zero_is_not_the_identity() -> None:
    """select(x == 0, 0, x), which JAX's sort writes to make -0 and +0 one key, equals x everywhere
    but at -0: it is not ACT's identity."""
    text = """HloModule canonical_zero
ENTRY main {
  x = f32[256,512] parameter(0)
  zero = f32[] constant(0)
  zeros = f32[256,512] broadcast(zero), dimensions={}
  is_zero = pred[256,512] compare(x, zeros), direction=EQ
  y = f32[256,512] select(is_zero, zeros, x)
  ROOT out = f32[256,512] tanh(y)
}
"""
    program = lower_module(parse_hlo_text(text))
    optimize(program, ["fusion", "cse"], num_stages=None)
    assert select_act_functions(program).activations == 0


NAN_GUARD = """HloModule nan_guard
ENTRY main {
  x = f32[128,40] parameter(0)
  y = f32[128,40] log(x)
  is_nan = pred[128,40] compare(y, y), direction=NE
  zero = f32[] constant(0)
  zeros = f32[128,40] broadcast(zero), dimensions={}
  ROOT out = f32[128,40] select(is_nan, zeros, y)
}
"""


@pytest.mark.parametrize("guard", ["compare(y, y), direction=NE", "is-finite(y)"], ids=["isnan", "isfinite"])
def test_a_chain_that_only_differs_at_nan_or_infinity_is_not_the_identity(guard: str) -> None:
    """where(isnan(y), 0, y) (jnp.where(jnp.isnan(y), ...), as JAX writes isnan: y != y) equals y at
    every finite y; so does where(isfinite(y), y, 0). Neither is ACT's identity."""
    text = NAN_GUARD.replace("compare(y, y), direction=NE", guard)
    if guard.startswith("is-finite"):
        text = text.replace("select(is_nan, zeros, y)", "select(is_nan, y, zeros)")
    program = lower_module(parse_hlo_text(text))
    optimize(program, ["fusion", "cse"], num_stages=None)
    assert select_act_functions(program).activations == 0


def test_a_nan_guard_compiles_to_what_it_says(tmp_path: Path) -> None:
    """From the CLI, on inputs whose log is NaN: the NaNs come out as zeros (the guard was once
    folded into an identity activation, and every NaN came through)."""
    model = tmp_path / "nan_guard.hlo"
    model.write_text(NAN_GUARD)
    x = np.random.default_rng(3).normal(0, 1, (128, 40)).astype(np.float32)
    inputs, out, neff = tmp_path / "in.npz", tmp_path / "out.npz", tmp_path / "g.neff"
    np.savez(inputs, arg0=x)
    done = run_ncc("compile", str(model), "--output", str(neff), "--verify")
    assert done.returncode == 0, done.stderr
    assert run_ncc("run", str(neff), "--inputs", str(inputs), "--output", str(out)).returncode == 0
    with np.errstate(invalid="ignore"):
        expected = np.where(x < 0, np.float32(0), np.log(x))
    got = np.load(out)["out0"]
    assert not np.isnan(got).any()
    np.testing.assert_allclose(got, expected, rtol=1e-5)


def test_constants_after_a_reader_of_x_are_not_a_cone_of_x() -> None:
    """x's only reader also reads w (so it is not of x's cone), and constant fills follow it: they
    are no function of x to replace (jax.random.normal's erf_inv, whose coefficients are selects of
    constants, once stopped the Frontend with an internal error here)."""
    text = """HloModule constants_after_a_reader
ENTRY main {
  x = f32[128,64] parameter(0)
  w = f32[128,64] parameter(1)
  a = f32[128,64] multiply(x, w)
  zero = f32[] constant(0)
  zeros = f32[128,64] broadcast(zero), dimensions={}
  positive = pred[128,64] compare(a, zeros), direction=GT
  c1 = f32[] constant(1.5)
  c2 = f32[] constant(-2.5)
  c3 = f32[] constant(3.25)
  c4 = f32[] constant(-4.75)
  b1 = f32[128,64] broadcast(c1), dimensions={}
  b2 = f32[128,64] broadcast(c2), dimensions={}
  b3 = f32[128,64] broadcast(c3), dimensions={}
  b4 = f32[128,64] broadcast(c4), dimensions={}
  s1 = f32[128,64] select(positive, b1, b2)
  s2 = f32[128,64] select(positive, b3, b4)
  m = f32[128,64] multiply(s1, a)
  ROOT out = f32[128,64] add(m, s2)
}
"""
    program = lower_module(parse_hlo_text(text))
    optimize(program, ["fusion", "cse"], num_stages=None)
    assert select_act_functions(program).activations == 0


def test_a_long_fused_chain_is_searched_in_windows_of_bounded_cones(monkeypatch) -> None:
    """A fused chain of N elementwise ops makes every tensor's cone the rest of the chain; cones past
    MAX_STATEMENTS are not searched, so the statements evaluated grow with N, not N² (the scale
    family's chain of 12,500 ran its Frontend past 10 minutes before)."""
    from ncc.tools.hlo_opt.passes import act_functions

    evaluated: list[int] = []
    real = act_functions._evaluate
    monkeypatch.setattr(act_functions, "_evaluate", lambda structure: evaluated.append(len(structure))
                        or real(structure))
    lines = ["HloModule chain", "ENTRY main {", "  x0 = f32[128,64] parameter(0)",
             "  c = f32[] constant(0.5)", "  cb = f32[128,64] broadcast(c), dimensions={}"]
    n = 3 * act_functions.MAX_STATEMENTS
    for i in range(1, n + 1):
        body = f"tanh(x{i - 1})" if i % 2 else f"multiply(x{i - 1}, cb)"
        lines.append(f"  {'ROOT ' if i == n else ''}x{i} = f32[128,64] {body}")
    program = lower_module(parse_hlo_text("\n".join(lines) + "\n}\n"))
    optimize(program, ["fusion"])
    assert len(program.nests) == 1 and len(program.nests[0].statements) > n
    select_act_functions(program)
    assert max(evaluated, default=0) <= act_functions.MAX_STATEMENTS
    assert sum(evaluated) <= act_functions.MAX_STATEMENTS ** 2
