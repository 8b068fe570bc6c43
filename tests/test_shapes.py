"""Shapes no bundled model has: HLO written by the test compiles (--verify) and `ncc run` matches numpy.

Each case is a small HLO text module with awkward sizes: partial partition tiles (65, 259 rows),
partial free tiles (2500 columns = 2048 + 452), K = 1280 contractions (10 K tiles), 3-D batch
dots, a contraction over lhs dim 0, 3-D transposes, causal masks built from iota, bf16 round
trips, slices and concatenations, calls and tuple results; then shapes that found lowering bugs
(a bf16 reduce, zero-element arrays) or could (scalars, results that are views). Every case is
compiled through the real CLI with `--verify` (the golden evaluator and the simulator check each
other inside the compile), then run with `ncc run` on inputs made here and compared with a numpy
reference computed here, independently of the compiler's own evaluator. Every case also checks the
instruction budget's count.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import pytest
from conftest import run_ncc
from hlo_gen import ADD, MAX

from ncc.tools.common.penguin_budget import instruction_count
from ncc.tools.hlo.hlo_text import parse_hlo_text
from ncc.tools.hlo.hlo_verify import verify_module
from ncc.tools.hlo2penguin.lower import lower_module
from ncc.tools.hlo_opt.bir_codegen import lower_to_bir

Arrays = list[np.ndarray]

def bf16_round(x: np.ndarray) -> np.ndarray:
    """Round float32 values to the nearest bfloat16 (ties to even), returned widened to float32."""
    bits = np.ascontiguousarray(x, dtype=np.float32).view(np.uint32).astype(np.uint64)
    rounded = (bits + 0x7FFF + ((bits >> 16) & 1)) & 0xFFFF0000
    return rounded.astype(np.uint32).view(np.float32)


def softmax_rows(x: np.ndarray) -> np.ndarray:
    """numpy softmax over the last axis."""
    shifted = np.exp(x - x.max(axis=-1, keepdims=True))
    return shifted / shifted.sum(axis=-1, keepdims=True)


def softmax_hlo(name: str, rows: int, cols: int, source: str) -> str:
    """HLO lines for a JAX-style softmax over the last dim of `source` (f32[rows, cols]) into `name`."""
    return f"""
  {name}.ninf = f32[] constant(-inf)
  {name}.max = f32[{rows}] reduce({source}, {name}.ninf), dimensions={{1}}, to_apply=max
  {name}.maxb = f32[{rows},{cols}] broadcast({name}.max), dimensions={{0}}
  {name}.sub = f32[{rows},{cols}] subtract({source}, {name}.maxb)
  {name}.exp = f32[{rows},{cols}] exponential({name}.sub)
  {name}.zero = f32[] constant(0)
  {name}.sum = f32[{rows}] reduce({name}.exp, {name}.zero), dimensions={{1}}, to_apply=add
  {name}.sumb = f32[{rows},{cols}] broadcast({name}.sum), dimensions={{0}}
  ROOT {name} = f32[{rows},{cols}] divide({name}.exp, {name}.sumb)"""


@dataclass(frozen=True)
class Case:
    """One HLO text module, its inputs (f32 arrays; bf16 parameters get bf16-exact values) and reference."""

    name: str
    hlo: str
    inputs: Callable[[np.random.Generator], Arrays]
    reference: Callable[..., np.ndarray | tuple[np.ndarray, ...]]
    bf16: bool = False  # compare with a relative bound of 2e-2 instead of atol 1e-3
    rtol: float = 0.0  # fp32: allow atol 1e-3 + rtol * max |expected| (large sums in another order)


def normal(*shapes: tuple[int, ...], bf16: bool = False) -> Callable[[np.random.Generator], Arrays]:
    """Inputs ~ N(0, 1) of these shapes (rounded to bf16 values when `bf16`)."""
    def make(rng: np.random.Generator) -> Arrays:
        arrays = [rng.standard_normal(shape).astype(np.float32) for shape in shapes]
        return [bf16_round(a) for a in arrays] if bf16 else arrays
    return make


def dims(shape: tuple[int, ...]) -> str:
    """HLO dimension list: (65, 301) -> '65,301'."""
    return ",".join(map(str, shape))


def elementwise_case(shape: tuple[int, ...]) -> Case:
    """add, multiply, exp and tanh, each its own nest: tanh(x) * exp(y) + x."""
    s = dims(shape)
    hlo = f"""HloModule ew_{'x'.join(map(str, shape))}
ENTRY main {{
  x = f32[{s}] parameter(0)
  y = f32[{s}] parameter(1)
  t = f32[{s}] tanh(x)
  e = f32[{s}] exponential(y)
  m = f32[{s}] multiply(t, e)
  ROOT r = f32[{s}] add(m, x)
}}"""
    return Case(f"elementwise_{'x'.join(map(str, shape))}", hlo, normal(shape, shape),
                lambda x, y: np.tanh(x) * np.exp(y) + x)


def reduce_case(kind: str, shape: tuple[int, int], dim: int) -> Case:
    """reduce-sum or reduce-max of a 2-D f32 array over `dim` (0: across partitions, 1: free)."""
    rows, cols = shape
    kept = cols if dim == 0 else rows
    init, comp = ("0", "add") if kind == "sum" else ("-inf", "max")
    hlo = f"""HloModule reduce_{kind}
{ADD if kind == "sum" else MAX}
ENTRY main {{
  x = f32[{rows},{cols}] parameter(0)
  i = f32[] constant({init})
  ROOT r = f32[{kept}] reduce(x, i), dimensions={{{dim}}}, to_apply={comp}
}}"""
    fn = np.sum if kind == "sum" else np.max
    return Case(f"reduce_{kind}_dim{dim}_{rows}x{cols}", hlo, normal(shape),
                lambda x: fn(x.astype(np.float64), axis=dim))


CASES: list[Case] = [
    elementwise_case((65, 301)),
    elementwise_case((259, 1111)),
    elementwise_case((3, 2500)),
    elementwise_case((1_000_000,)),  # a vector fills the partitions: 128 x 7812.5 -> 125 x 8000
    elementwise_case((1009,)),  # a prime length: one partition of 1009
    reduce_case("sum", (259, 1111), 1),
    reduce_case("max", (259, 1111), 1),
    reduce_case("sum", (65, 301), 0),
    reduce_case("max", (65, 301), 0),
    reduce_case("sum", (3, 2500), 1),  # two free tiles combined under predicates
    reduce_case("max", (200, 4100), 1),  # three free tiles, the last one partial
    Case("softmax_200x1000", f"""HloModule softmax
{ADD}{MAX}
ENTRY main {{
  x = f32[200,1000] parameter(0){softmax_hlo("out", 200, 1000, "x")}
}}""", normal((200, 1000)), softmax_rows),
    Case("dot_130x1280x300", """HloModule dot
ENTRY main {
  a = f32[130,1280] parameter(0)
  b = f32[1280,300] parameter(1)
  ROOT d = f32[130,300] dot(a, b), lhs_contracting_dims={1}, rhs_contracting_dims={0}
}""", normal((130, 1280), (1280, 300)), lambda a, b: a.astype(np.float64) @ b),
    Case("batch_dot_3x65x72x130", """HloModule batch_dot
ENTRY main {
  a = f32[3,65,72] parameter(0)
  b = f32[3,72,130] parameter(1)
  ROOT d = f32[3,65,130] dot(a, b), lhs_batch_dims={0}, lhs_contracting_dims={2}, rhs_batch_dims={0},
    rhs_contracting_dims={1}
}""", normal((3, 65, 72), (3, 72, 130)), lambda a, b: np.einsum("bmk,bkn->bmn", a.astype(np.float64), b)),
    Case("batch_dot_batch_in_the_middle", """HloModule batch_dot_mid
ENTRY main {
  a = f32[65,3,72] parameter(0)
  b = f32[72,3,130] parameter(1)
  ROOT d = f32[3,65,130] dot(a, b), lhs_batch_dims={1}, lhs_contracting_dims={2}, rhs_batch_dims={1},
    rhs_contracting_dims={0}
}""", normal((65, 3, 72), (72, 3, 130)), lambda a, b: np.einsum("mbk,kbn->bmn", a.astype(np.float64), b)),
    Case("dot_lhs_contracting_dim0", """HloModule dot_t
ENTRY main {
  a = f32[200,65] parameter(0)
  b = f32[200,130] parameter(1)
  ROOT d = f32[65,130] dot(a, b), lhs_contracting_dims={0}, rhs_contracting_dims={0}
}""", normal((200, 65), (200, 130)), lambda a, b: a.T.astype(np.float64) @ b),
    Case("dot_rhs_contracting_dim1", """HloModule dot_nt
ENTRY main {
  a = f32[65,200] parameter(0)
  b = f32[130,200] parameter(1)
  ROOT d = f32[65,130] dot(a, b), lhs_contracting_dims={1}, rhs_contracting_dims={1}
}""", normal((65, 200), (130, 200)), lambda a, b: a.astype(np.float64) @ b.T),
    Case("transpose_3d_root", """HloModule transpose_root
ENTRY main {
  x = f32[5,65,37] parameter(0)
  ROOT t = f32[65,37,5] transpose(x), dimensions={1,2,0}
}""", normal((5, 65, 37)), lambda x: np.transpose(x, (1, 2, 0))),
    Case("transpose_3d_into_add", """HloModule transpose_add
ENTRY main {
  x = f32[7,130,3] parameter(0)
  y = f32[3,130,7] parameter(1)
  t = f32[3,130,7] transpose(x), dimensions={2,1,0}
  ROOT r = f32[3,130,7] add(t, y)
}""", normal((7, 130, 3), (3, 130, 7)), lambda x, y: np.transpose(x, (2, 1, 0)) + y),
    Case("causal_mask_softmax_128", f"""HloModule causal
{ADD}{MAX}
ENTRY main {{
  x = f32[128,128] parameter(0)
  row = s32[128,128] iota(), iota_dimension=0
  col = s32[128,128] iota(), iota_dimension=1
  keep = pred[128,128] compare(row, col), direction=GE
  ninf = f32[] constant(-inf)
  fill = f32[128,128] broadcast(ninf), dimensions={{}}
  masked = f32[128,128] select(keep, x, fill){softmax_hlo("out", 128, 128, "masked")}
}}""", normal((128, 128)),
         lambda x: softmax_rows(np.where(np.tril(np.ones((128, 128), bool)), x, -np.inf))),
    Case("iota_mask_partial_tiles_200x2300", """HloModule iota_mask
ENTRY main {
  x = f32[200,2300] parameter(0)
  row = s32[200,2300] iota(), iota_dimension=0
  col = s32[200,2300] iota(), iota_dimension=1
  keep = pred[200,2300] compare(col, row), direction=LT
  zero = f32[] constant(0)
  fill = f32[200,2300] broadcast(zero), dimensions={}
  ROOT masked = f32[200,2300] select(keep, x, fill)
}""", normal((200, 2300)), lambda x: np.where(np.arange(2300)[None, :] < np.arange(200)[:, None], x, 0)),
    Case("convert_f32_bf16_f32", """HloModule convert
ENTRY main {
  x = f32[65,301] parameter(0)
  b = bf16[65,301] convert(x)
  ROOT f = f32[65,301] convert(b)
}""", normal((65, 301)), bf16_round),  # exact: a truncating convert is off by up to half a bf16 ulp
    Case("slice_concatenate", """HloModule slice_concat
ENTRY main {
  x = f32[65,301] parameter(0)
  y = f32[40,301] parameter(1)
  a = f32[65,100] slice(x), slice={[0:65], [10:210:2]}
  b = f32[65,51] slice(x), slice={[0:65], [250:301]}
  c = f32[65,151] concatenate(a, b), dimensions={1}
  d = f32[20,151] slice(y), slice={[1:40:2], [150:301]}
  ROOT e = f32[85,151] concatenate(c, d), dimensions={0}
}""", normal((65, 301), (40, 301)),
         lambda x, y: np.concatenate([np.concatenate([x[:, 10:210:2], x[:, 250:301]], axis=1),
                                      y[1:40:2, 150:301]], axis=0)),
    Case("call_helper", """HloModule call
helper {
  p = f32[65,301] parameter(0)
  q = f32[65,301] parameter(1)
  s = f32[65,301] subtract(p, q)
  ROOT m = f32[65,301] multiply(s, s)
}
ENTRY main {
  x = f32[65,301] parameter(0)
  y = f32[65,301] parameter(1)
  c = f32[65,301] call(x, y), to_apply=helper
  ROOT r = f32[65,301] add(c, y)
}""", normal((65, 301), (65, 301)), lambda x, y: (x - y) ** 2 + y),
    Case("tuple_root_two_outputs", f"""HloModule tuple
{ADD}
ENTRY main {{
  x = f32[259,301] parameter(0)
  e = f32[259,301] exponential(x)
  z = f32[] constant(0)
  s = f32[259] reduce(x, z), dimensions={{1}}, to_apply=add
  ROOT t = (f32[259,301], f32[259]) tuple(e, s)
}}""", normal((259, 301)), lambda x: (np.exp(x), x.astype(np.float64).sum(axis=1))),
    Case("bf16_dot_convert_f32", """HloModule bf16_dot
ENTRY main {
  a = bf16[128,256] parameter(0)
  b = bf16[256,200] parameter(1)
  d = bf16[128,200] dot(a, b), lhs_contracting_dims={1}, rhs_contracting_dims={0}
  ROOT f = f32[128,200] convert(d)
}""", normal((128, 256), (256, 200), bf16=True), lambda a, b: a.astype(np.float64) @ b, bf16=True),
    Case("bf16_dot_f32_result", """HloModule bf16_dot_f32
ENTRY main {
  a = bf16[128,256] parameter(0)
  b = bf16[256,200] parameter(1)
  ROOT d = f32[128,200] dot(a, b), lhs_contracting_dims={1}, rhs_contracting_dims={0}
}""", normal((128, 256), (256, 200), bf16=True), lambda a, b: a.astype(np.float64) @ b, bf16=True),
    # Beyond the list: shapes that found or could find lowering bugs.
    Case("bf16_reduce_sum", """HloModule bf16_reduce
bfadd {
  a = bf16[] parameter(0)
  b = bf16[] parameter(1)
  ROOT s = bf16[] add(a, b)
}
ENTRY main {
  x = bf16[65,2301] parameter(0)
  z = bf16[] constant(0)
  r = bf16[65] reduce(x, z), dimensions={1}, to_apply=bfadd
  ROOT f = f32[65] convert(r)
}""", normal((65, 2301), bf16=True), lambda x: x.astype(np.float64).sum(axis=1), bf16=True),
    Case("reduce_3d_over_dims_0_and_2", f"""HloModule reduce_3d
{ADD}
ENTRY main {{
  x = f32[5,65,37] parameter(0)
  z = f32[] constant(0.5)
  ROOT r = f32[65] reduce(x, z), dimensions={{0,2}}, to_apply=add
}}""", normal((5, 65, 37)), lambda x: x.astype(np.float64).sum(axis=(0, 2)) + 0.5),
    Case("reduce_to_scalar", f"""HloModule reduce_scalar
{MAX}
ENTRY main {{
  x = f32[259,1111] parameter(0)
  z = f32[] constant(-inf)
  ROOT r = f32[] reduce(x, z), dimensions={{0,1}}, to_apply=max
}}""", normal((259, 1111)), lambda x: np.max(x)),
    Case("scalar_parameter", """HloModule scalar_param
ENTRY main {
  x = f32[259,301] parameter(0)
  k = f32[] parameter(1)
  kb = f32[259,301] broadcast(k), dimensions={}
  ROOT r = f32[259,301] multiply(x, kb)
}""", normal((259, 301), ()), lambda x, k: x * k),
    Case("batch_dot_multi_k_multi_n", """HloModule batch_dot_k
ENTRY main {
  a = f32[2,130,300] parameter(0)
  b = f32[2,300,600] parameter(1)
  ROOT d = f32[2,130,600] dot(a, b), lhs_batch_dims={0}, lhs_contracting_dims={2}, rhs_batch_dims={0},
    rhs_contracting_dims={1}
}""", normal((2, 130, 300), (2, 300, 600)), lambda a, b: np.einsum("bmk,bkn->bmn", a.astype(np.float64), b)),
    Case("scalar_first_operands_and_compares", """HloModule reverse
ENTRY main {
  x = f32[65,301] parameter(0)
  one = f32[] constant(1)
  ob = f32[65,301] broadcast(one), dimensions={}
  s = f32[65,301] subtract(ob, x)
  two = f32[] constant(2)
  tb = f32[65,301] broadcast(two), dimensions={}
  d = f32[65,301] divide(tb, s)
  z = f32[] constant(0)
  zb = f32[65,301] broadcast(z), dimensions={}
  g = pred[65,301] compare(zb, x), direction=LT
  gf = f32[65,301] convert(g)
  ROOT o = f32[65,301] add(d, gf)
}""", lambda rng: [rng.uniform(-0.5, 0.5, (65, 301)).astype(np.float32)], lambda x: 2 / (1 - x) + (x > 0)),
    Case("transposed_and_reshaped_results", """HloModule results
ENTRY main {
  x = f32[65,301] parameter(0)
  e = f32[65,301] exponential(x)
  t = f32[301,65] transpose(e), dimensions={1,0}
  r = f32[5,13,301] reshape(e)
  ROOT o = (f32[301,65], f32[5,13,301], f32[65,301]) tuple(t, r, x)
}""", normal((65, 301)), lambda x: (np.exp(x).T, np.exp(x).reshape(5, 13, 301), x)),
    Case("dot_k4096_squared", """HloModule dot_squared
ENTRY main {
  a = f32[128,4096] parameter(0)
  b = f32[4096,128] parameter(1)
  d = f32[128,128] dot(a, b), lhs_contracting_dims={1}, rhs_contracting_dims={0}
  ROOT s = f32[128,128] multiply(d, d)
}""", normal((128, 4096), (4096, 128)), lambda a, b: (a.astype(np.float64) @ b) ** 2, rtol=1e-5),
    Case("zero_element_arrays", f"""HloModule zero
{ADD}
ENTRY main {{
  x = f32[65,10] parameter(0)
  b = f32[0,30] parameter(1)
  s = f32[65,0] slice(x), slice={{[0:65], [3:3]}}
  e = f32[65,0] exponential(s)
  c = f32[65,10] concatenate(e, x), dimensions={{1}}
  z = f32[] constant(2.5)
  r = f32[65] reduce(s, z), dimensions={{1}}, to_apply=add
  d = f32[65,30] dot(s, b), lhs_contracting_dims={{1}}, rhs_contracting_dims={{0}}
  ROOT t = (f32[65,10], f32[65], f32[65,30], f32[65,0]) tuple(c, r, d, e)
}}""", normal((65, 10), (0, 30)),
         lambda x, b: (x, np.full(65, 2.5), np.zeros((65, 30)), np.zeros((65, 0)))),
]


def check_close(case: Case, name: str, got: np.ndarray, want: np.ndarray) -> None:
    """Same shape and infinities; |error| <= 1e-3 + rtol·max|want| (fp32) or 2e-2·max(1, max|want|) (bf16)."""
    assert got.shape == want.shape, f"{case.name} {name}: shape {got.shape}, expected {want.shape}"
    got64, want64 = got.astype(np.float64), np.asarray(want, dtype=np.float64)
    assert np.array_equal(np.isinf(got64), np.isinf(want64)), f"{case.name} {name}: infinities differ"
    finite = np.isfinite(want64)
    error = float(np.max(np.abs(got64[finite] - want64[finite]), initial=0.0))
    scale = float(np.max(np.abs(want64[finite]), initial=0.0))
    if case.bf16:
        relative = error / max(1.0, scale)
        assert relative <= 2e-2, f"{case.name} {name}: relative error {relative:.3g}"
    else:
        bound = 1e-3 + case.rtol * scale
        assert error <= bound, f"{case.name} {name}: max |error| {error:.3g} > {bound:.3g}"


@pytest.mark.parametrize("case", CASES, ids=[c.name for c in CASES])
def test_instruction_budget_count_is_exact(case: Case) -> None:
    """The budget's count (no unrolling) is exactly what BirCodeGenLoop unrolls, partial tiles included."""
    module = parse_hlo_text(case.hlo)
    verify_module(module)
    program = lower_module(module)
    count, points, _, _ = instruction_count(program)
    assert count == len(lower_to_bir(program).instructions)
    assert points <= count


@pytest.mark.slow
@pytest.mark.parametrize("case", CASES, ids=[c.name for c in CASES])
def test_shape_compiles_verifies_and_matches_numpy(tmp_path: Path, case: Case) -> None:
    model = tmp_path / f"{case.name}.hlo"
    model.write_text(case.hlo + "\n")
    neff = tmp_path / f"{case.name}.neff"
    compiled = run_ncc("compile", str(model), "--output", str(neff), "--verify", timeout=120)
    assert compiled.returncode == 0, compiled.stderr
    assert "Traceback" not in compiled.stderr

    inputs = case.inputs(np.random.default_rng(sum(map(ord, case.name))))
    inputs_path, out_path = tmp_path / "in.npz", tmp_path / "out.npz"
    np.savez(inputs_path, **{f"arg{k}": a for k, a in enumerate(inputs)})
    ran = run_ncc("run", str(neff), "--inputs", str(inputs_path), "--output", str(out_path), timeout=120)
    assert ran.returncode == 0, ran.stderr

    with np.errstate(all="ignore"):
        expected = case.reference(*inputs)
    expected = expected if isinstance(expected, tuple) else (expected,)
    with np.load(out_path) as outputs:
        assert sorted(outputs.files) == [f"out{k}" for k in range(len(expected))]
        for k, want in enumerate(expected):
            check_close(case, f"out{k}", outputs[f"out{k}"], want)


WIDE_ADD_MUL = """HloModule add_mul_wide
ENTRY main {
  x = f32[128,65536] parameter(0)
  y = f32[128,65536] parameter(1)
  m = f32[128,65536] multiply(x, y)
  ROOT r = f32[128,65536] add(m, x)
}"""


@pytest.mark.slow
def test_many_tiles_fit_in_sbuf(tmp_path: Path) -> None:
    """32 column tiles of 2 x 8 KiB inputs each: the scheduler must finish tiles before it loads
    more, or SBUF (176 KiB per partition) overflows with E403 (found by this suite)."""
    model = tmp_path / "m.hlo"
    model.write_text(WIDE_ADD_MUL + "\n")
    compiled = run_ncc("compile", str(model), "--output", str(tmp_path / "m.neff"), "--verify", timeout=120)
    assert "Traceback" not in compiled.stderr
    assert compiled.returncode == 0, compiled.stderr[:500]
