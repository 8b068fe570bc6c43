"""A layer norm's γ and β applied by ACT on the copy out of the PE transpose that hands the norm's
output to a dot (tools/hlo_opt/passes/affine_tail.py): the norm's nest loses its two DVE passes,
the values are the same bit for bit as with `forward{affine_tails=0}`, and from the CLI the
program verifies, matches numpy and takes less time; for a dot whose rows are its stationary
side (256 rows) and one computed swapped (197: the norm's output is its moving side), and an
RMSNorm's weight alone (act_operand = scale)."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
from orchestrator_support import compile_and_run

from ncc.schemas import common_pb2
from ncc.tools.hlo.hlo_text import parse_hlo_text
from ncc.tools.hlo2penguin.lower import lower_module
from ncc.tools.hlo_opt.optimizer import DEFAULT_PASSES, optimize

D, OUT = 384, 256
WITHOUT = ",".join(p if p != "forward" else "forward{affine_tails=0}" for p in DEFAULT_PASSES)


def _head(name: str, rows: int, params: list[str]) -> str:
    """The module's header, its parameters (x first) and the constants both norms use."""
    lines = [f"  {p} parameter({k})" for k, p in enumerate([f"x = f32[{rows},{D}]", *params])]
    add = "ADD { a = f32[] parameter(0)  b = f32[] parameter(1)  ROOT s = f32[] add(a, b) }"
    constants = f"  zero = f32[] constant(0)\n  n = f32[] constant({D})\n  eps = f32[] constant(1e-06)\n"
    return f"HloModule {name}\n{add}\nENTRY main {{\n" + "\n".join(lines) + "\n" + constants


def norm_then_dot(rows: int) -> str:
    """layer_norm(x) · γ + β, then @ w, as JAX writes it (a sum, a mean, a centred square)."""
    r, rd = f"f32[{rows}]", f"f32[{rows},{D}]"
    return _head("norm_then_dot", rows, [f"g = f32[{D}]", f"b = f32[{D}]", f"w = f32[{D},{OUT}]"]) + f"""\
  s = {r} reduce(x, zero), dimensions={{1}}, to_apply=ADD
  nb = {r} broadcast(n), dimensions={{}}
  mean = {r} divide(s, nb)
  meanb = {rd} broadcast(mean), dimensions={{0}}
  c = {rd} subtract(x, meanb)
  sq = {rd} multiply(c, c)
  v = {r} reduce(sq, zero), dimensions={{1}}, to_apply=ADD
  var = {r} divide(v, nb)
  epsb = {r} broadcast(eps), dimensions={{}}
  rs = {r} rsqrt({r} add(var, epsb))
  rsb = {rd} broadcast(rs), dimensions={{0}}
  xhat = {rd} multiply(c, rsb)
  gb = {rd} broadcast(g), dimensions={{1}}
  scaled = {rd} multiply(xhat, gb)
  bb = {rd} broadcast(b), dimensions={{1}}
  y = {rd} add(scaled, bb)
  ROOT d = f32[{rows},{OUT}] dot(y, w), lhs_contracting_dims={{1}}, rhs_contracting_dims={{0}}
}}
"""


def rms_then_dot(rows: int) -> str:
    """An RMSNorm (x · rsqrt(mean(x²) + ε) · weight, no β), then @ w."""
    r, rd = f"f32[{rows}]", f"f32[{rows},{D}]"
    return _head("rms_then_dot", rows, [f"g = f32[{D}]", f"w = f32[{D},{OUT}]"]) + f"""\
  sq = {rd} multiply(x, x)
  v = {r} reduce(sq, zero), dimensions={{1}}, to_apply=ADD
  nb = {r} broadcast(n), dimensions={{}}
  ms = {r} divide(v, nb)
  epsb = {r} broadcast(eps), dimensions={{}}
  rs = {r} rsqrt({r} add(ms, epsb))
  rsb = {rd} broadcast(rs), dimensions={{0}}
  xhat = {rd} multiply(x, rsb)
  gb = {rd} broadcast(g), dimensions={{1}}
  y = {rd} multiply(xhat, gb)
  ROOT d = f32[{rows},{OUT}] dot(y, w), lhs_contracting_dims={{1}}, rhs_contracting_dims={{0}}
}}
"""


def _optimized(text: str, passes: list[str]):
    program = lower_module(parse_hlo_text(text))
    optimize(program, passes)
    return program


@pytest.mark.parametrize(("norm", "rows", "role"), [(norm_then_dot, 256, "scale_bias"),
                                                    (norm_then_dot, 197, "scale_bias"),
                                                    (rms_then_dot, 256, "scale")])
def test_gamma_and_beta_leave_the_norm_for_the_transposes_copy(norm, rows: int, role: str):
    program = _optimized(norm(rows), list(DEFAULT_PASSES))
    kept = _optimized(norm(rows), WITHOUT.split(","))
    tails = [st for n in program.nests for st in n.statements if st.attributes.get("act_operand") == role]
    assert tails and all(st.op == "activation" and st.engine == common_pb2.ACT
                         and len(st.inputs) == 1 + len(role.split("_")) for st in tails)
    assert not any(st.attributes.get("act_operand") for n in kept.nests for st in n.statements)

    def dve_passes(p) -> int:
        return sum(st.op == "tensor_tensor" for n in p.nests for st in n.statements)

    assert dve_passes(program) == dve_passes(kept) - len(role.split("_"))  # · γ (and + β)


@pytest.mark.parametrize(("norm", "rows"), [(norm_then_dot, 256), (norm_then_dot, 197), (rms_then_dot, 256)])
def test_from_the_cli_the_same_bits_as_on_dve_in_less_time(tmp_path: Path, norm, rows: int):
    rng = np.random.default_rng(rows)
    x = rng.normal(0, 2, (rows, D)).astype(np.float32)
    x[0, :3] = [0.0, -0.0, 1e-30]
    g = rng.normal(1, 0.2, D).astype(np.float32)
    b = rng.normal(0, 0.2, D).astype(np.float32)
    w = (rng.normal(0, 1, (D, OUT)) / np.sqrt(D)).astype(np.float32)
    model, inputs = tmp_path / "norm_then_dot.hlo", tmp_path / "inputs.npz"
    model.write_text(norm(rows))
    if norm is rms_then_dot:
        np.savez(inputs, arg0=x, arg1=g, arg2=w)
        y = x / np.sqrt((x * x).mean(axis=1, keepdims=True) + 1e-6) * g
    else:
        np.savez(inputs, arg0=x, arg1=g, arg2=b, arg3=w)
        mean = x.mean(axis=1, keepdims=True)
        y = (x - mean) / np.sqrt(((x - mean) ** 2).mean(axis=1, keepdims=True) + 1e-6) * g + b
    folded = compile_and_run(model, inputs, "folded")
    on_dve = compile_and_run(model, inputs, "on_dve", "--penguin-passes", WITHOUT)
    assert np.array_equal(folded["out0"].view(np.uint32), on_dve["out0"].view(np.uint32))
    np.testing.assert_allclose(folded["out0"], y @ w, rtol=1e-4, atol=1e-4)
    assert folded["simulated_ns"] < on_dve["simulated_ns"]
