"""The Penguin pass `forward`: a load of an intermediate another nest stored from an SBUF tile reads
that tile (a copy, or a PE transpose into PSUM and a copy), and the store goes when nobody else
reads the intermediate; refused where the tile cannot serve the load."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
from conftest import run_ncc

from ncc.schemas import bir_pb2, common_pb2, penguin_pb2
from ncc.tools.common.hbm_traffic import hbm_bytes
from ncc.tools.hlo.hlo_text import parse_hlo_text
from ncc.tools.hlo2penguin.lower import lower_module
from ncc.tools.hlo_opt.nonfinite import nonfinite_tensors
from ncc.tools.hlo_opt.optimizer import DEFAULT_PASSES, optimize
from ncc.tools.hlo_opt.passes.forwarding import forward_tiles

# the dot's epilogue stays a nest of its own (no `epilogues`), so there is a result to forward
BEFORE_FORWARD = [p for p in DEFAULT_PASSES[: DEFAULT_PASSES.index("forward")] if p != "epilogues"]

# tanh(x) feeds a dot as its stationary operand (transposed: the contraction dim on partitions),
# the dot's result feeds an elementwise epilogue (same layout), and the dot's weights come in.
DOT_EPILOGUE = """HloModule dot_epilogue
ENTRY main {
  x = f32[128,256] parameter(0)
  w = f32[256,192] parameter(1)
  t = f32[128,256] tanh(x)
  d = f32[128,192] dot(t, w), lhs_contracting_dims={1}, rhs_contracting_dims={0}
  ROOT e = f32[128,192] exponential(d)
}
"""

# The same with 200 rows: a full and a partial partition tile, clipped alike in both views.
DOT_EPILOGUE_200 = DOT_EPILOGUE.replace("128,", "200,")

# One activation read by two dots: the second copies the first one's transposed tile.
TWO_DOTS = """HloModule two_dots
ENTRY main {
  x = f32[128,256] parameter(0)
  w = f32[256,128] parameter(1)
  v = f32[256,128] parameter(2)
  t = f32[128,256] tanh(x)
  a = f32[128,128] dot(t, w), lhs_contracting_dims={1}, rhs_contracting_dims={0}
  b = f32[128,128] dot(t, v), lhs_contracting_dims={1}, rhs_contracting_dims={0}
  ROOT s = f32[128,128] add(a, b)
}
"""


# 197 rows by a [256, 256] weight, then another dot: the first is computed swapped.
SWAPPED_DOT = """HloModule swapped_dot
ENTRY main {
  x = f32[197,256] parameter(0)
  w = f32[256,256] parameter(1)
  v = f32[256,128] parameter(2)
  t = f32[197,256] tanh(x)
  d = f32[197,256] dot(t, w), lhs_contracting_dims={1}, rhs_contracting_dims={0}
  e = f32[197,256] exponential(d)
  ROOT f = f32[197,128] dot(e, v), lhs_contracting_dims={1}, rhs_contracting_dims={0}
}
"""

# A masked softmax along axis 0: the masked scores hold -inf by construction, and transposing
# them on PE (a matmul against an identity: -inf * 0 = NaN) would turn every output into NaN.
MASKED_TRANSPOSE = """HloModule masked_transpose
max {
  a = f32[] parameter(0)
  b = f32[] parameter(1)
  ROOT m = f32[] maximum(a, b)
}
add {
  a = f32[] parameter(0)
  b = f32[] parameter(1)
  ROOT s = f32[] add(a, b)
}
ENTRY main {
  x = f32[128,96] parameter(0)
  m = pred[128,96] parameter(1)
  fill = f32[] constant(FILL)
  fills = f32[128,96] broadcast(fill), dimensions={}
  masked = f32[128,96] select(m, x, fills)
  t = f32[96,128] transpose(masked), dimensions={1,0}
  zero = f32[] constant(0)
  low = f32[] constant(-inf)
  top = f32[96] reduce(t, low), dimensions={1}, to_apply=max
  tops = f32[96,128] broadcast(top), dimensions={0}
  e = f32[96,128] exponential(f32[96,128] subtract(t, tops))
  sums = f32[96,128] broadcast(f32[96] reduce(e, zero), dimensions={1}, to_apply=add), dimensions={0}
  ROOT p = f32[96,128] divide(e, sums)
}
"""


def _optimized(text: str, **forward_options: int) -> tuple[penguin_pb2.Program, object]:
    program = lower_module(parse_hlo_text(text))
    optimize(program, BEFORE_FORWARD)
    stats = forward_tiles(program, **forward_options)
    optimize(program, ["dce"])
    return program, stats


def _ops(program: penguin_pb2.Program) -> list[str]:
    return [st.op for nest in program.nests for st in nest.statements]


def test_a_dot_reads_its_stationary_tile_transposed_on_chip_and_its_epilogue_reads_its_result():
    program, stats = _optimized(DOT_EPILOGUE)
    assert stats.transposes == 1 and stats.copies >= 1 and stats.loads_forwarded >= 2
    tensors = {t.name: t for t in program.tensors}
    # t and d are no longer stored to HBM: only x, w and e remain there
    stored = {tensors[a.tensor].view_of or a.tensor for nest in program.nests for st in nest.statements
              for a in st.outputs if tensors[a.tensor].memory == 1}
    assert stored == {"e"}
    assert "transpose" in _ops(program)


def test_a_partial_last_tile_forwards_when_both_views_clip_it_alike():
    _, stats = _optimized(DOT_EPILOGUE_200)
    assert stats.transposes == 1 and stats.loads_forwarded >= 2 and not stats.refused


def test_a_swapped_dots_moving_columns_are_transposed_on_chip_one_row_tile_at_a_time():
    """197 rows by a [256, 256] weight, read by another dot: the dot is computed swapped
    (tools/hlo2penguin/dot_orientation.py), its moving operand tanh(x) transposed, 197 columns
    that tanh's nest holds as row tiles of 128 and 69: one PE transpose per row tile it crosses."""
    program, stats = _optimized(SWAPPED_DOT)
    dot = next(n for n in program.nests if n.name.split("_")[0].endswith(".t"))  # the dot swapped
    assert [st.op for st in dot.statements].count("transpose") == 2
    assert stats.loads_forwarded >= 2 and not stats.refused


def test_two_dots_of_one_activation_transpose_it_once():
    program, stats = _optimized(TWO_DOTS)
    assert stats.transposes == 1 and stats.loads_forwarded == 4  # two lhsT, and the add's a and b
    assert _ops(program).count("transpose") == 1


def test_a_tile_larger_than_the_limit_keeps_its_round_trip():
    _, stats = _optimized(DOT_EPILOGUE, max_bytes=512)
    assert stats.loads_forwarded == 0 and stats.refused.get("size", 0) >= 2


def test_an_intermediate_written_twice_is_not_forwarded():
    text = """HloModule twice
ENTRY main {
  x = f32[128,256] parameter(0)
  u = f32[64,256] parameter(1)
  t = f32[128,256] tanh(x)
  z = s32[] constant(0)
  p = f32[128,256] dynamic-update-slice(t, u, z, z)
  ROOT e = f32[128,256] exponential(p)
}
"""
    program = lower_module(parse_hlo_text(text))
    optimize(program, BEFORE_FORWARD)
    tensors = {t.name: t for t in program.tensors}

    def base(name: str) -> str:
        return tensors[name].view_of or name

    writers: dict[str, int] = {}
    for nest in program.nests:
        for st in nest.statements:
            for a in st.outputs:
                writers[base(a.tensor)] = writers.get(base(a.tensor), 0) + 1
    twice = {name for name, count in writers.items() if count > 1 and tensors[name].memory == 1}
    assert twice, "the test needs an intermediate with two writers"
    forward_tiles(program)
    readers = [st for nest in program.nests for st in nest.statements
               if any(base(a.tensor) in twice for a in st.inputs)]
    assert readers and all(st.op == "dma" for st in readers)  # they still load it from HBM


def _compile(tmp_path: Path, text: str, name: str, *flags: str, rows: int = 128
             ) -> tuple[bir_pb2.Program, np.ndarray]:
    model = tmp_path / f"{name}.hlo"
    model.write_text(text)
    neff = tmp_path / f"{name}.neff"
    compiled = run_ncc("compile", str(model), "--output", str(neff), "--verify", *flags, timeout=300)
    assert compiled.returncode == 0, compiled.stderr
    bir = bir_pb2.Program()
    bir.ParseFromString(next((tmp_path / f"{name}.ncc-work").glob("*_Frontend/bir.pb")).read_bytes())
    inputs = tmp_path / f"{name}.inputs.npz"
    rng = np.random.default_rng(0)
    np.savez(inputs, arg0=rng.standard_normal((rows, 256), dtype=np.float32),
             arg1=rng.standard_normal((256, 192), dtype=np.float32) / 16)
    out = tmp_path / f"{name}.out.npz"
    ran = run_ncc("run", str(neff), "--inputs", str(inputs), "--output", str(out), timeout=300)
    assert ran.returncode == 0, ran.stderr
    return bir, np.load(out)["out0"]


def test_a_tile_holding_minus_infinity_by_construction_is_not_transposed_on_pe() -> None:
    program, stats = _optimized(MASKED_TRANSPOSE.replace("FILL", "-inf"))
    assert stats.transposes == 0 and stats.refused.get("non-finite", 0) >= 1
    assert "transpose" not in _ops(program)
    program, stats = _optimized(MASKED_TRANSPOSE.replace("FILL", "-1e30"))  # a finite fill may go
    assert stats.transposes >= 1 and "non-finite" not in stats.refused


@pytest.mark.slow
def test_a_masked_softmax_along_axis_0_computes_numbers_at_o2(tmp_path: Path) -> None:
    model = tmp_path / "masked.hlo"
    model.write_text(MASKED_TRANSPOSE.replace("FILL", "-inf"))
    neff, inputs, out = tmp_path / "masked.neff", tmp_path / "in.npz", tmp_path / "out.npz"
    compiled = run_ncc("compile", str(model), "--output", str(neff), "--verify", timeout=300)  # -O2
    assert compiled.returncode == 0, compiled.stderr
    rng = np.random.default_rng(1)
    x = rng.standard_normal((128, 96), dtype=np.float32)
    mask = rng.random((128, 96)) < 0.7
    mask[0] = True  # every column keeps a value
    np.savez(inputs, arg0=x, arg1=mask)
    ran = run_ncc("run", str(neff), "--inputs", str(inputs), "--output", str(out), timeout=300)
    assert ran.returncode == 0, ran.stderr
    scores = np.where(mask, x, -np.inf).T.astype(np.float64)
    want = np.exp(scores - scores.max(axis=1, keepdims=True))
    want /= want.sum(axis=1, keepdims=True)
    got = np.load(out)["out0"]
    assert np.isfinite(got).all()
    np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-6)


# log(relu(x)) @ w (a JAX model nobody tuned for): a row of x with no positive value is -inf after
# the log, by computation rather than by construction. Transposed on PE for the dot, that -inf
# made every row of the output NaN, where XLA makes only that row non-finite.
LOG_OF_RELU_DOT = """HloModule log_relu_dot
ENTRY main {
  x = f32[64,96] parameter(0)
  w = f32[96,80] parameter(1)
  zero = f32[] constant(0)
  r = f32[64,96] maximum(x, f32[64,96] broadcast(zero), dimensions={})
  l = f32[64,96] log(r)
  ROOT d = f32[64,80] dot(l, w), lhs_contracting_dims={1}, rhs_contracting_dims={0}
}
"""


# Row sums of squares, their square root, and a division by it: a row of zeros makes 0/0 = NaN,
# and a dot then needs the quotient transposed. An exp of unshifted values overflows past 88.7.
ROW_NORM_DOT = """HloModule row_norm_dot
add {
  a = f32[] parameter(0)
  b = f32[] parameter(1)
  ROOT s = f32[] add(a, b)
}
ENTRY main {
  x = f32[64,96] parameter(0)
  w = f32[96,80] parameter(1)
  zero = f32[] constant(0)
  ss = f32[64] reduce(f32[64,96] multiply(x, x), zero), dimensions={1}, to_apply=add
  n = f32[64,96] broadcast(f32[64] sqrt(ss)), dimensions={0}
  q = f32[64,96] FUNC
  ROOT d = f32[64,80] dot(q, w), lhs_contracting_dims={1}, rhs_contracting_dims={0}
}
"""


@pytest.mark.parametrize(("func", "refused"), [
    ("divide(x, n)", True),  # 0/0 in a row of zeros
    ("exponential(x)", True),  # exp(89) = inf
    ("multiply(x, n)", False),  # finite operands, finite product (below 3.4e38)
    ("divide(x, f32[64,96] add(n, f32[64,96] broadcast(f32[] constant(1e-6)), dimensions={}))", False),
])
def test_only_a_function_that_finite_operands_can_make_infinite_keeps_its_tile_off_pe(
    func: str, refused: bool
) -> None:
    """sqrt(sum of squares) >= 0, + eps > 0, so dividing by it is finite; by it alone, not."""
    _, stats = _optimized(ROW_NORM_DOT.replace("FUNC", func))
    assert ("non-finite" in stats.refused) == refused, stats
    assert (stats.transposes == 0) == refused, stats


def _softmax_with_exp_scaled_by(scale: float) -> penguin_pb2.Program:
    """max(x), x - max(x), then ACT's exp((x - max(x)) * scale): one nest, statements only."""
    program = penguin_pb2.Program()
    for name in ("x", "m", "s", "e"):
        program.tensors.add(name=name, dtype=common_pb2.F32)
    nest = program.nests.add(name="softmax")

    def statement(op: str, func: str, inputs: list[str], output: str, scalars=()) -> None:
        st = nest.statements.add(op=op, func=func, scalars=list(scalars))
        st.inputs.extend(penguin_pb2.Access(tensor=name) for name in inputs)
        st.outputs.add(tensor=output)

    statement("tensor_reduce", "maximum", ["x"], "m")
    statement("tensor_tensor", "subtract", ["x", "m"], "s")
    statement("activation", "exp", ["s"], "e", (scale, -0.0))
    return program


@pytest.mark.parametrize(("scale", "singular"), [(1.0, False), (0.5, False), (0.0, False), (-1.0, True)])
def test_exp_of_x_minus_its_max_is_safe_only_while_the_argument_stays_at_most_0(scale, singular) -> None:
    """exp((x - max) * s) <= 1 for s >= 0; for s < 0 the argument is >= 0 and exp may overflow."""
    program = _softmax_with_exp_scaled_by(scale)
    assert ("e" in nonfinite_tensors(program)) == singular


def test_a_tile_that_a_log_can_make_infinite_is_not_transposed_on_pe(tmp_path: Path) -> None:
    program, stats = _optimized(LOG_OF_RELU_DOT)
    assert stats.transposes == 0 and stats.refused.get("non-finite", 0) >= 1
    model, neff = tmp_path / "m.hlo", tmp_path / "m.neff"
    model.write_text(LOG_OF_RELU_DOT)
    assert run_ncc("compile", str(model), "--output", str(neff), timeout=300).returncode == 0
    rng = np.random.default_rng(2)
    x = np.abs(rng.standard_normal((64, 96), dtype=np.float32)) + 0.1
    x[5] = -1.0  # log(relu(-1)) = -inf all along row 5
    w = rng.standard_normal((96, 80), dtype=np.float32)
    np.savez(tmp_path / "in.npz", arg0=x, arg1=w)
    ran = run_ncc("run", str(neff), "--inputs", str(tmp_path / "in.npz"), "--output", str(tmp_path / "o.npz"))
    assert ran.returncode == 0, ran.stderr
    got = np.load(tmp_path / "o.npz")["out0"]
    assert not np.isfinite(got[5]).any() and np.isfinite(np.delete(got, 5, axis=0)).all()
    want = np.log(np.delete(x, 5, axis=0)).astype(np.float64) @ w
    np.testing.assert_allclose(np.delete(got, 5, axis=0), want, rtol=1e-4, atol=1e-4)


@pytest.mark.slow
def test_forwarded_code_verifies_from_the_cli_moves_fewer_bytes_and_computes_the_same_bits(tmp_path: Path):
    without = ",".join(p for p in DEFAULT_PASSES if p != "forward")
    forwarded, out = _compile(tmp_path, DOT_EPILOGUE, "forwarded")
    kept, reference = _compile(tmp_path, DOT_EPILOGUE, "kept", f"--penguin-passes={without}")
    assert out.tobytes() == reference.tobytes()  # a copy and a transpose of finite values are exact
    assert sum(hbm_bytes(forwarded).values()) < sum(hbm_bytes(kept).values())
    assert any(i.op == "transpose" for i in forwarded.instructions)
    assert not any(i.op == "transpose" for i in kept.instructions)
    # software-pipelined nests forward too (the stage guards and shifts are followed)
    pipelined, out3 = _compile(tmp_path, DOT_EPILOGUE, "pipelined", "--num-stages", "3")
    assert out3.tobytes() == reference.tobytes()
    assert sum(hbm_bytes(pipelined).values()) == sum(hbm_bytes(forwarded).values())
    partial, out200 = _compile(tmp_path, DOT_EPILOGUE_200, "partial", rows=200)
    _, reference200 = _compile(tmp_path, DOT_EPILOGUE_200, "partial_kept", f"--penguin-passes={without}",
                               rows=200)
    assert out200.tobytes() == reference200.tobytes()
    assert any(i.op == "transpose" for i in partial.instructions)


def test_a_software_pipelined_producer_and_consumer_still_forward():
    program = lower_module(parse_hlo_text(DOT_EPILOGUE))
    optimize(program, BEFORE_FORWARD, num_stages=2)
    assert any("pipelined" in axis.attributes for nest in program.nests for axis in nest.axes)
    stats = forward_tiles(program)
    assert stats.transposes == 1 and stats.loads_forwarded >= 2


def test_a_bitcast_load_is_not_turned_into_a_converting_copy():
    """A dma from an f32 view into an s32 tile moves bytes (bitcast-convert); a tensor_copy would
    convert the values, so such a load keeps its round trip."""
    text = """HloModule bits
ENTRY main {
  x = f32[128,64] parameter(0)
  t = f32[128,64] tanh(x)
  b = s32[128,64] bitcast-convert(t)
  ROOT r = s32[128,64] add(b, b)
}
"""
    program, stats = _optimized(text)
    tensors = {t.name: t for t in program.tensors}
    reads_of_t = [st for nest in program.nests for st in nest.statements
                  if any((tensors[a.tensor].view_of or a.tensor) == "t" for a in st.inputs)]
    assert reads_of_t and all(st.op == "dma" for st in reads_of_t)
    assert stats.copies == 0 and stats.transposes == 0
