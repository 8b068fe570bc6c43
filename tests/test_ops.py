"""Elementwise ops beyond the bundled models, and exact integer arithmetic, end to end.

Each case is an HLO text module that computes several ops on odd shapes (partial partition tiles,
two free tiles, a vector) and returns them as a tuple. It is compiled through the real CLI with
`--verify` (the golden evaluator and the simulator check each other; integer and pred outputs must
match exactly), then run with `ncc run` on inputs made here, and every output is compared with a
numpy reference computed here, independently of ncc's own numerics: integers and preds exactly,
floats within 1e-5 relative.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import pytest
from conftest import run_ncc

from ncc.tools.hlo.rng_bits import ALGORITHM_NAMES, rng_bit_generator
from ncc.tools.sim.__main__ import compare


@dataclass(frozen=True)
class Case:
    name: str
    hlo: str
    inputs: Callable[[np.random.Generator], list[np.ndarray]]
    reference: Callable[..., tuple[np.ndarray, ...]]


def _module(name: str, params: list[str], lines: list[str], results: list[str]) -> str:
    body = [f"  p{k} = {shape} parameter({k})" for k, shape in enumerate(params)]
    body += [f"  {line}" for line in lines]
    types = ", ".join(result.split(" ", 1)[0] for result in results)
    names = ", ".join(result.split(" ", 1)[1] for result in results)
    body.append(f"  ROOT out = ({types}) tuple({names})")
    return f"HloModule {name}\n\nENTRY main {{\n" + "\n".join(body) + "\n}\n"


F = "f32[130,2100]"
FLOAT_UNARY = Case(
    "float_unary",
    _module("float_unary", [F], [
        f"e = {F} exponential-minus-one(p0)",
        f"a = {F} abs(p0)",
        f"l = {F} log-plus-one(a)",
        f"s = {F} sine(p0)",
        f"c = {F} cosine(p0)",
        f"t = {F} tan(p0)",
        f"r = {F} cbrt(p0)",
        f"fl = {F} floor(p0)",
        f"ce = {F} ceil(p0)",
        f"re = {F} round-nearest-even(p0)",
        f"ra = {F} round-nearest-afz(p0)",
        f"sg = {F} sign(p0)",
        f"er = {F} erf(p0)",
    ], [f"{F} e", f"{F} l", f"{F} s", f"{F} c", f"{F} t", f"{F} r", f"{F} fl", f"{F} ce", f"{F} re",
        f"{F} ra", f"{F} a", f"{F} sg", f"{F} er"]),
    # halves exercise both rounding modes' ties
    lambda rng: [np.round(rng.standard_normal((130, 2100)) * 6, 1).astype(np.float32) / 2],
    lambda x: (np.expm1(x), np.log1p(np.abs(x)), np.sin(x), np.cos(x), np.tan(x), np.cbrt(x), np.floor(x),
               np.ceil(x), np.rint(x), np.where(np.abs(x - np.trunc(x)) == 0.5, np.trunc(x) + np.sign(x),
                                               np.rint(x)), np.abs(x), np.sign(x),
               np.vectorize(math.erf)(x.astype(np.float64))),
)

# erf of a rank-0 value (jax.scipy.special.erf of a scalar) crashed the golden evaluator: numpy's
# frompyfunc gives a Python float for a 0-d array
SCALAR_ERF = Case(
    "scalar_erf",
    _module("scalar_erf", ["f32[]"], ["er = f32[] erf(p0)", "x = f32[] multiply(er, p0)"],
            ["f32[] er", "f32[] x"]),
    lambda rng: [np.float32(0.3)],
    lambda x: (np.float32(math.erf(0.3)), np.float32(math.erf(0.3)) * x),
)

# -0 through ACT's functions: sqrt, tanh, sin and sign keep it, so 1/f(-0) is -inf, and rsqrt(-0) is
# -inf (an activation's bias of +0 would have made every -0 +0; numpy's sign makes it +0, XLA's not)
Z = "f32[3,5]"
SIGNED_ZEROS = Case(
    "signed_zeros",
    _module("signed_zeros", [Z], [
        "one = f32[] constant(1)",
        f"ones = {Z} broadcast(one), dimensions={{}}",
        f"r = {Z} rsqrt(p0)",
        f"sq = {Z} sqrt(p0)",
        f"th = {Z} tanh(p0)",
        f"sn = {Z} sine(p0)",
        f"isq = {Z} divide(ones, sq)",
        f"ith = {Z} divide(ones, th)",
        f"isn = {Z} divide(ones, sn)",
        f"sg = {Z} sign(p0)",
        f"isg = {Z} divide(ones, sg)",
    ], [f"{Z} r", f"{Z} isq", f"{Z} ith", f"{Z} isn", f"{Z} isg"]),
    lambda rng: [np.array([[-0.0, 0.0, -0.0, 4.0, 0.25]] * 3, dtype=np.float32)],
    lambda x: (np.float32(1) / np.sqrt(x), np.float32(1) / np.sqrt(x), np.float32(1) / np.tanh(x),
               np.float32(1) / np.sin(x), np.float32(1) / np.where(x == 0, x, np.sign(x))),
)

G = "f32[65,301]"
FLOAT_BINARY = Case(
    "float_binary",
    _module("float_binary", [G, G], [
        f"a = {G} abs(p0)",
        f"pw = {G} power(a, p1)",
        f"rm = {G} remainder(p0, p1)",
        f"at = {G} atan2(p0, p1)",
        "lo = f32[] constant(-0.5)",
        "hi = f32[] constant(0.5)",
        f"cl = {G} clamp(lo, p0, hi)",
        "z = f32[] constant(0)",
        f"zb = {G} broadcast(z), dimensions={{}}",
        f"q = {G} divide(p0, zb)",
        "fin = pred[65,301] is-finite(q)",
        f"cp = {G} copy(p1)",
    ], [f"{G} pw", f"{G} rm", f"{G} at", f"{G} cl", "pred[65,301] fin", f"{G} cp"]),
    lambda rng: [rng.standard_normal((65, 301)).astype(np.float32),
                 np.where(rng.random((65, 301)) < 0.1, 0, rng.standard_normal((65, 301))).astype(np.float32)],
    lambda x, y: (np.power(np.abs(x), y), np.fmod(x, y), np.arctan2(x, y), np.clip(x, -0.5, 0.5),
                  np.isfinite(x / np.float32(0)), y),
)

S = "s32[129,77]"
U = "u8[129,77]"


def _int_reference(a: np.ndarray, b: np.ndarray, u: np.ndarray, v: np.ndarray) -> tuple[np.ndarray, ...]:
    a64, b64 = a.astype(np.int64), b.astype(np.int64)
    amount = b64 & 63  # 0..63: in range and past the width of 32 and 8 bits

    def s32(x: np.ndarray) -> np.ndarray:
        return (np.asarray(x, dtype=np.int64) & 0xFFFFFFFF).astype(np.uint32).view(np.int32)

    shl = np.where(amount < 32, s32(a64 << np.minimum(amount, 31)), 0)
    shr = np.where(amount < 32, (a64 & 0xFFFFFFFF) >> np.minimum(amount, 31), 0)
    sar = a64 >> np.minimum(amount, 31)
    safe = np.where(b64 == 0, 1, b64)
    quotient = np.where(b64 == 0, -1, np.trunc(a64 / safe).astype(np.int64))
    rest = np.where(b64 == 0, a64, a64 - np.trunc(a64 / safe).astype(np.int64) * safe)
    power = s32(a64 ** np.abs(np.fmod(b64, 5)))  # wraps mod 2**64, so its low 32 bits are right
    u_amount = v.astype(np.int64) & 15
    u_shr = np.where(u_amount < 8, u.astype(np.int64) >> np.minimum(u_amount, 7), 0)
    return (a & b, a | b, a ^ b, ~a, s32(shl), s32(shr), s32(sar), s32(quotient), s32(rest), np.abs(a),
            np.sign(a), power, np.clip(a, -1000, 1000), (-a).astype(np.int32), u_shr.astype(np.uint8))


INTEGERS = Case(
    "integers",
    _module("integers", [S, S, U, U], [
        f"and = {S} and(p0, p1)",
        f"or = {S} or(p0, p1)",
        f"xor = {S} xor(p0, p1)",
        f"not = {S} not(p0)",
        "m63 = s32[] constant(63)",
        f"m63b = {S} broadcast(m63), dimensions={{}}",
        f"amount = {S} and(p1, m63b)",
        f"shl = {S} shift-left(p0, amount)",
        f"shr = {S} shift-right-logical(p0, amount)",
        f"sar = {S} shift-right-arithmetic(p0, amount)",
        f"div = {S} divide(p0, p1)",
        f"rem = {S} remainder(p0, p1)",
        f"abs = {S} abs(p0)",
        f"sign = {S} sign(p0)",
        "five = s32[] constant(5)",
        f"fiveb = {S} broadcast(five), dimensions={{}}",
        f"small = {S} remainder(p1, fiveb)",
        f"small_pos = {S} abs(small)",
        f"pow = {S} power(p0, small_pos)",
        "lo = s32[] constant(-1000)",
        "hi = s32[] constant(1000)",
        f"clamp = {S} clamp(lo, p0, hi)",
        f"neg = {S} negate(p0)",
        "m15 = u8[] constant(15)",
        f"m15b = {U} broadcast(m15), dimensions={{}}",
        f"uamount = {U} and(p3, m15b)",
        f"ushr = {U} shift-right-logical(p2, uamount)",
    ], [f"{S} and", f"{S} or", f"{S} xor", f"{S} not", f"{S} shl", f"{S} shr", f"{S} sar", f"{S} div",
        f"{S} rem", f"{S} abs", f"{S} sign", f"{S} pow", f"{S} clamp", f"{S} neg", f"{U} ushr"]),
    lambda rng: [rng.integers(-2**31, 2**31, (129, 77)).astype(np.int32),
                 np.where(rng.random((129, 77)) < 0.1, 0, rng.integers(-70, 70, (129, 77))).astype(np.int32),
                 rng.integers(0, 256, (129, 77)).astype(np.uint8),
                 rng.integers(0, 256, (129, 77)).astype(np.uint8)],
    lambda a, b, u, v: _int_reference(a, b, u, v),
)


P = "pred[1000]"
PREDICATES = Case(
    "predicates",
    _module("predicates", [P, P], [
        f"a = {P} and(p0, p1)",
        f"o = {P} or(p0, p1)",
        f"x = {P} xor(p0, p1)",
        f"n = {P} not(p0)",
    ], [f"{P} a", f"{P} o", f"{P} x", f"{P} n"]),
    lambda rng: [rng.random(1000) < 0.5, rng.random(1000) < 0.5],
    lambda p, q: (p & q, p | q, p ^ q, ~p),
)

# 4097 * 4097 + 3 * 7 = 16785430 needs 25 bits: fp32 (what PE multiplies in) cannot hold it.
INTEGER_DOT = Case(
    "integer_dot",
    _module("integer_dot", ["s32[3,130,2100]", "s32[3,2100,5]", "s8[7,9]", "s8[9,3]"], [
        "d = s32[3,130,5] dot(p0, p1), lhs_batch_dims={0}, rhs_batch_dims={0}, lhs_contracting_dims={2}, "
        "rhs_contracting_dims={1}",
        "e = s32[7,3] dot(p2, p3), lhs_contracting_dims={1}, rhs_contracting_dims={0}",
    ], ["s32[3,130,5] d", "s32[7,3] e"]),
    lambda rng: [rng.integers(-5000, 5000, (3, 130, 2100)).astype(np.int32),
                 rng.integers(-5000, 5000, (3, 2100, 5)).astype(np.int32),
                 rng.integers(-128, 128, (7, 9)).astype(np.int8),
                 rng.integers(-128, 128, (9, 3)).astype(np.int8)],
    lambda a, b, c, d: (np.matmul(a.astype(np.int64), b.astype(np.int64)).astype(np.int32),
                        (c.astype(np.int64) @ d.astype(np.int64)).astype(np.int32)),
)

# 8-bit integer dots (quantized matmuls) run on PE while every partial sum stays below 2^24 (the
# largest here: K = 1000 rows of -128 x -128, 16,384,000); past that bound they take the vector
# engines; an s8 result wraps
INT8_DOTS = Case(
    "int8_dots",
    _module("int8_dots", ["s8[130,1000]", "s8[1000,70]", "u8[64,300]", "s8[300,40]", "s8[20,1100]",
                          "s8[1100,8]"], [
        "a = s32[130,70] dot(p0, p1), lhs_contracting_dims={1}, rhs_contracting_dims={0}",
        "b = s32[64,40] dot(p2, p3), lhs_contracting_dims={1}, rhs_contracting_dims={0}",
        "c = s8[64,40] dot(p2, p3), lhs_contracting_dims={1}, rhs_contracting_dims={0}",
        "d = s32[20,8] dot(p4, p5), lhs_contracting_dims={1}, rhs_contracting_dims={0}",
    ], ["s32[130,70] a", "s32[64,40] b", "s8[64,40] c", "s32[20,8] d"]),
    lambda rng: [_extreme_row(rng.integers(-128, 128, (130, 1000)).astype(np.int8)),
                 _extreme_row(rng.integers(-128, 128, (1000, 70)).astype(np.int8).T).T,
                 rng.integers(0, 256, (64, 300)).astype(np.uint8),
                 rng.integers(-128, 128, (300, 40)).astype(np.int8),
                 rng.integers(-128, 128, (20, 1100)).astype(np.int8),
                 rng.integers(-128, 128, (1100, 8)).astype(np.int8)],
    lambda a, b, c, d, e, f: ((a.astype(np.int64) @ b.astype(np.int64)).astype(np.int32),
                              (c.astype(np.int64) @ d.astype(np.int64)).astype(np.int32),
                              (c.astype(np.int64) @ d.astype(np.int64)).astype(np.int8),
                              (e.astype(np.int64) @ f.astype(np.int64)).astype(np.int32)),
)


def _extreme_row(x: np.ndarray) -> np.ndarray:
    """Row 0 all -128: against an all -128 column its dot is the largest an s8 dot of this K reaches."""
    x = x.copy()
    x[0] = -128
    return x


def test_int8_dots_run_on_pe_within_the_exact_bound() -> None:
    from ncc.tools.hlo.hlo_text import parse_hlo_text
    from ncc.tools.hlo2penguin.lower import lower_module

    def ops(k: int) -> list[str]:
        text = _module("m", [f"s8[64,{k}]", f"s8[{k},32]"],
                       ["d = s32[64,32] dot(p0, p1), lhs_contracting_dims={1}, rhs_contracting_dims={0}"],
                       ["s32[64,32] d"])
        return [st.op for nest in lower_module(parse_hlo_text(text)).nests for st in nest.statements]

    assert "matmul" in ops(1023) and "matmul" not in ops(1024)


def _padded(x: np.ndarray) -> np.ndarray:
    """pad(x, -1.5), padding=1_2x-3_-1_2: rows 1 low 2 high; columns crop 3 low and 1 high, 2 between."""
    dilated = np.full((x.shape[0], (x.shape[1] - 1) * 3 + 1), np.float32(-1.5))
    dilated[:, ::3] = x
    dilated = dilated[:, 3:-1]
    out = np.full((x.shape[0] + 3, dilated.shape[1]), np.float32(-1.5))
    out[1:1 + x.shape[0]] = dilated
    return out


MOVEMENT = Case(
    "movement",
    """HloModule movement
ENTRY main {
  x = f32[130,70] parameter(0)
  z = f32[] constant(-1.5)
  p = f32[133,204] pad(x, z), padding=1_2x-3_-1_2
  r = f32[130,70] reverse(x), dimensions={0,1}
  b = f32[70,130] bitcast(x)
  t = f32[70,130]{0,1} transpose(x), dimensions={1,0}
  bt = f32[130,70] bitcast(t)
  i = s32[] constant(5)
  j = s32[] constant(60)
  ds = f32[4,20] dynamic-slice(x, i, j), dynamic_slice_sizes={4,20}
  u = f32[2,3] constant({ {1, 2, 3}, {4, 5, 6} })
  dus = f32[130,70] dynamic-update-slice(x, u, i, j)
  ROOT out = (f32[133,204], f32[130,70], f32[70,130], f32[130,70], f32[4,20], f32[130,70])
    tuple(p, r, b, bt, ds, dus)
}
""",
    lambda rng: [rng.standard_normal((130, 70)).astype(np.float32)],
    # the bitcast of a {0,1}-layout transpose reads the same bytes: x again; slices clamp to fit
    lambda x: (_padded(x), x[::-1, ::-1], x.reshape(70, 130), x, x[5:9, 50:70],
               _updated(x, np.array([[1, 2, 3], [4, 5, 6]], dtype=np.float32), 5, 60)),
)


def _updated(x: np.ndarray, update: np.ndarray, row: int, col: int) -> np.ndarray:
    out = x.copy()
    out[row:row + update.shape[0], col:col + update.shape[1]] = update
    return out


def _scan_reference(x: np.ndarray, flag: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    h = np.zeros_like(x)
    carry = np.zeros(x.shape[1], dtype=np.float32)
    for i in range(x.shape[0]):
        carry = np.tanh(x[i] + carry * np.float32(0.5))
        h[i] = carry
    return h, np.exp(h) if flag > 0 else -h


# lax.scan as JAX emits it: a while loop over a counter tuple, dynamic-slice and dynamic-update-slice
# by the counter; then a conditional on a computed predicate.
CONTROL_FLOW = Case(
    "control_flow",
    """HloModule scan
body {
  s = (s32[], f32[64], f32[12,64], f32[12,64]) parameter(0)
  i = s32[] get-tuple-element(s), index=0
  carry = f32[64] get-tuple-element(s), index=1
  h = f32[12,64] get-tuple-element(s), index=2
  xs = f32[12,64] get-tuple-element(s), index=3
  zero = s32[] constant(0)
  row = f32[1,64] dynamic-slice(xs, i, zero), dynamic_slice_sizes={1,64}
  row1 = f32[64] reshape(row)
  half = f32[] constant(0.5)
  halfb = f32[64] broadcast(half), dimensions={}
  scaled = f32[64] multiply(carry, halfb)
  sum = f32[64] add(row1, scaled)
  next = f32[64] tanh(sum)
  next2 = f32[1,64] reshape(next)
  h2 = f32[12,64] dynamic-update-slice(h, next2, i, zero)
  one = s32[] constant(1)
  i2 = s32[] add(i, one)
  ROOT t = (s32[], f32[64], f32[12,64], f32[12,64]) tuple(i2, next, h2, xs)
}

cond {
  s = (s32[], f32[64], f32[12,64], f32[12,64]) parameter(0)
  i = s32[] get-tuple-element(s), index=0
  n = s32[] constant(12)
  ROOT lt = pred[] compare(i, n), direction=LT
}

on_true {
  a = f32[12,64] parameter(0)
  ROOT e = f32[12,64] exponential(a)
}

on_false {
  a = f32[12,64] parameter(0)
  ROOT e = f32[12,64] negate(a)
}

ENTRY main {
  x = f32[12,64] parameter(0)
  flag = f32[] parameter(1)
  c = s32[] constant(0)
  zz = f32[] constant(0)
  carry0 = f32[64] broadcast(zz), dimensions={}
  h0 = f32[12,64] broadcast(zz), dimensions={}
  init = (s32[], f32[64], f32[12,64], f32[12,64]) tuple(c, carry0, h0, x)
  w = (s32[], f32[64], f32[12,64], f32[12,64]) while(init), condition=cond, body=body
  h = f32[12,64] get-tuple-element(w), index=2
  p = pred[] compare(flag, zz), direction=GT
  r = f32[12,64] conditional(p, h, h), true_computation=on_true, false_computation=on_false
  ROOT out = (f32[12,64], f32[12,64]) tuple(h, r)
}
""",
    lambda rng: [rng.standard_normal((12, 64)).astype(np.float32), np.float32(rng.choice([-1.0, 1.0]))],
    _scan_reference,
)

# jnp.argmax's variadic reduce (NaN-aware, first index on ties) over both dimensions, on odd widths
ARGMAX = Case(
    "argmax",
    """HloModule argmax
argmax {
  a = f32[] parameter(0)
  ai = s32[] parameter(1)
  b = f32[] parameter(2)
  bi = s32[] parameter(3)
  gt = pred[] compare(a, b), direction=GT
  nan = pred[] compare(a, a), direction=NE
  g = pred[] or(gt, nan)
  eq = pred[] compare(a, b), direction=EQ
  lt = pred[] compare(ai, bi), direction=LT
  tie = pred[] and(eq, lt)
  pick = pred[] or(g, tie)
  v = f32[] select(pick, a, b)
  i = s32[] select(pick, ai, bi)
  ROOT t = (f32[], s32[]) tuple(v, i)
}

ENTRY main {
  x = f32[300,1001] parameter(0)
  idx = s32[300,1001] iota(), iota_dimension=1
  ridx = s32[300,1001] iota(), iota_dimension=0
  ninf = f32[] constant(-inf)
  zero = s32[] constant(0)
  r = (f32[300], s32[300]) reduce(x, idx, ninf, zero), dimensions={1}, to_apply=argmax
  c = (f32[1001], s32[1001]) reduce(x, ridx, ninf, zero), dimensions={0}, to_apply=argmax
  i = s32[300] get-tuple-element(r), index=1
  v = f32[300] get-tuple-element(r), index=0
  ci = s32[1001] get-tuple-element(c), index=1
  ROOT out = (s32[300], f32[300], s32[1001]) tuple(i, v, ci)
}
""",
    # ties are common (values rounded to 0.25), so the first-index rule is exercised; so are rows and
    # columns with several NaNs, whose first one JAX's comparator returns in a left fold (first_nan.py)
    lambda rng: [np.where(rng.random((300, 1001)) < 0.003, np.float32(np.nan),
                          np.round(rng.standard_normal((300, 1001)) * 4).astype(np.float32) / 4)],
    lambda x: (np.argmax(x, axis=1).astype(np.int32), x.max(axis=1), np.argmax(x, axis=0).astype(np.int32)),
)

# HLO text forms XLA's parser accepts: `HloModule name:`, results without shapes, nested operands
TEXT_FORMS = Case(
    "text_forms",
    """HloModule text_forms:

ENTRY main {
  x = f32[2,3] parameter(0)
  t = transpose(x), dimensions={1,0}
  n = negate(t)
  ROOT a = f32[3,2] add(f32[3,2] reshape(f32[6] reshape(x)), n)
}
""",
    lambda rng: [rng.standard_normal((2, 3)).astype(np.float32)],
    lambda x: (x.reshape(3, 2) - x.T,),
)

def _conv_nhwc(x: np.ndarray, w: np.ndarray, stride: tuple[int, int], pads: tuple[tuple[int, int], ...],
               dilation: tuple[int, int] = (1, 1), groups: int = 1) -> np.ndarray:
    """Direct convolution NHWC x HWIO, written out with loops over the kernel taps."""
    x = np.pad(x.astype(np.float64), ((0, 0), *pads, (0, 0)))
    kh, kw, per_group, out_features = w.shape
    oh = (x.shape[1] - (kh - 1) * dilation[0] - 1) // stride[0] + 1
    ow = (x.shape[2] - (kw - 1) * dilation[1] - 1) // stride[1] + 1
    out = np.zeros((x.shape[0], oh, ow, out_features))
    step = out_features // groups
    for i in range(kh):
        for j in range(kw):
            rows = slice(i * dilation[0], i * dilation[0] + (oh - 1) * stride[0] + 1, stride[0])
            cols = slice(j * dilation[1], j * dilation[1] + (ow - 1) * stride[1] + 1, stride[1])
            patch = x[:, rows, cols, :]
            for g in range(groups):
                out[..., g * step:(g + 1) * step] += patch[..., g * per_group:(g + 1) * per_group] @ \
                    w[i, j, :, g * step:(g + 1) * step]
    return out


def _max_pool(x: np.ndarray) -> np.ndarray:
    """3x3 windows, stride 2, padding 1 on each side (padding is -inf)."""
    padded = np.pad(x, ((0, 0), (1, 1), (1, 1), (0, 0)), constant_values=-np.inf)
    oh, ow = (padded.shape[1] - 3) // 2 + 1, (padded.shape[2] - 3) // 2 + 1
    windows = [padded[:, i:i + 2 * oh - 1:2, j:j + 2 * ow - 1:2] for i in range(3) for j in range(3)]
    return np.max(windows, axis=0)


# lax.conv_general_dilated as JAX emits it: strides, asymmetric padding, kernel dilation, a depthwise
# (feature-grouped) conv; a max pool and a cumulative sum as reduce-windows
WINDOWS = Case(
    "windows",
    """HloModule windows
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
  x = f32[2,9,11,6] parameter(0)
  w = f32[3,3,6,8] parameter(1)
  dw = f32[3,3,1,6] parameter(2)
  c = f32[2,5,5,8] convolution(x, w), window={size=3x3 stride=2x2 pad=1_1x0_2 rhs_dilate=1x2},
    dim_labels=b01f_01io->b01f
  d = f32[2,9,11,6] convolution(x, dw), window={size=3x3 pad=1_1x1_1}, dim_labels=b01f_01io->b01f,
    feature_group_count=6
  ninf = f32[] constant(-inf)
  p = f32[2,5,6,6] reduce-window(x, ninf), window={size=1x3x3x1 stride=1x2x2x1 pad=0_0x1_1x1_1x0_0},
    to_apply=max
  flat = f32[18,66] reshape(x)
  zero = f32[] constant(0)
  cs = f32[18,66] reduce-window(flat, zero), window={size=1x66 pad=0_0x65_0}, to_apply=add
  ROOT out = (f32[2,5,5,8], f32[2,9,11,6], f32[2,5,6,6], f32[18,66]) tuple(c, d, p, cs)
}
""",
    lambda rng: [rng.standard_normal((2, 9, 11, 6)).astype(np.float32),
                 rng.standard_normal((3, 3, 6, 8)).astype(np.float32),
                 rng.standard_normal((3, 3, 1, 6)).astype(np.float32)],
    lambda x, w, dw: (_conv_nhwc(x, w, (2, 2), ((1, 1), (0, 2)), dilation=(1, 2)),
                      _conv_nhwc(x, dw, (1, 1), ((1, 1), (1, 1)), groups=6), _max_pool(x),
                      np.cumsum(x.reshape(18, 66).astype(np.float64), axis=1)),
)

DEPTHWISE_HLO = """HloModule depthwise
ENTRY main {
  x = bf16[2,11,9,16] parameter(0)
  w = bf16[3,3,1,16] parameter(1)
  t = f32[2,40,12] parameter(2)
  k = f32[4,1,12] parameter(3)
  n = f32[2,6,9,9] parameter(4)
  m = f32[3,3,1,6] parameter(5)
  ab = bf16[2,6,5,16] convolution(x, w), window={size=3x3 stride=2x2 pad=1_1x1_1},
    dim_labels=b01f_01io->b01f, feature_group_count=16
  a = f32[2,6,5,16] convert(ab)
  c = f32[2,40,12] convolution(t, k), window={size=4 pad=3_0}, dim_labels=b0f_0io->b0f,
    feature_group_count=12
  d = f32[2,6,5,5] convolution(n, m), window={size=3x3 pad=0_0x0_0 rhs_dilate=2x2},
    dim_labels=bf01_01io->bf01, feature_group_count=6
  ROOT out = (f32[2,6,5,16], f32[2,40,12], f32[2,6,5,5]) tuple(a, c, d)
}
"""


def _halves(rng: np.random.Generator, shape: tuple[int, ...]) -> np.ndarray:
    """Values in {-1, -0.5, 0, 0.5, 1}: a 3x3 window's sum of their products is exact in bf16."""
    return (rng.integers(-2, 3, shape) / 2).astype(np.float32)


# depthwise convolutions (one feature a group: MobileNet's 3x3, Mamba's causal conv1d, a dilated
# one in NCHW) run as a multiply-add per tap in float32, bf16 operands included (rounded once)
DEPTHWISE = Case(
    "depthwise",
    DEPTHWISE_HLO,
    lambda rng: [_halves(rng, (2, 11, 9, 16)), _halves(rng, (3, 3, 1, 16)),
                 rng.standard_normal((2, 40, 12)).astype(np.float32),
                 rng.standard_normal((4, 1, 12)).astype(np.float32),
                 rng.standard_normal((2, 6, 9, 9)).astype(np.float32),
                 rng.standard_normal((3, 3, 1, 6)).astype(np.float32)],
    lambda x, w, t, k, n, m: (
        _conv_nhwc(x, w, (2, 2), ((1, 1), (1, 1)), groups=16),
        _conv_nhwc(t[:, None], k[None], (1, 1), ((0, 0), (3, 0)), groups=12)[:, 0],
        _conv_nhwc(n.transpose(0, 2, 3, 1), m, (1, 1), ((0, 0), (0, 0)), dilation=(2, 2), groups=6)
        .transpose(0, 3, 1, 2)),
)


# mixed precision as JAX's preferred_element_type writes it: bf16 operands, an f32 result (a dense
# convolution and a depthwise one), and int8 operands with an s32 result (was refused: E203)
MIXED_CONVOLUTIONS = Case(
    "mixed_convolutions",
    """HloModule mixed_convolutions
ENTRY main {
  x = bf16[2,11,9,16] parameter(0)
  w = bf16[3,3,16,24] parameter(1)
  dw = bf16[3,3,1,16] parameter(2)
  q = s8[1,9,9,4] parameter(3)
  k = s8[3,3,4,5] parameter(4)
  c = f32[2,6,9,24] convolution(x, w), window={size=3x3 stride=2x1 pad=1_1x1_1},
    dim_labels=b01f_01io->b01f
  d = f32[2,11,9,16] convolution(x, dw), window={size=3x3 pad=1_1x1_1}, dim_labels=b01f_01io->b01f,
    feature_group_count=16
  i = s32[1,9,9,5] convolution(q, k), window={size=3x3 pad=1_1x1_1}, dim_labels=b01f_01io->b01f
  ROOT out = (f32[2,6,9,24], f32[2,11,9,16], s32[1,9,9,5]) tuple(c, d, i)
}
""",
    lambda rng: [_halves(rng, (2, 11, 9, 16)), _halves(rng, (3, 3, 16, 24)), _halves(rng, (3, 3, 1, 16)),
                 rng.integers(-100, 100, (1, 9, 9, 4)).astype(np.int8),
                 rng.integers(-100, 100, (3, 3, 4, 5)).astype(np.int8)],
    lambda x, w, dw, q, k: (
        _conv_nhwc(x, w, (2, 1), ((1, 1), (1, 1))),
        _conv_nhwc(x, dw, (1, 1), ((1, 1), (1, 1)), groups=16),
        _conv_nhwc(q, k.astype(np.int64), (1, 1), ((1, 1), (1, 1))).astype(np.int32)),
)


def test_a_depthwise_convolution_runs_on_the_vector_engines() -> None:
    """One feature a group is a multiply-add per tap, not a one-column matmul per feature."""
    from ncc.tools.hlo.hlo_text import parse_hlo_text
    from ncc.tools.hlo2penguin.lower import lower_module

    program = lower_module(parse_hlo_text(DEPTHWISE_HLO))
    ops = [st.op for nest in program.nests for st in nest.statements]
    assert "matmul" not in ops and ops.count("tensor_tensor") >= 3 + 4 + 9


# an embedding lookup (indices out of range clamp, as XLA's gather does) and a KV-cache update and
# read at a run-time position: POOL's indirect dmas
INDEXED = Case(
    "indexed",
    """HloModule indexed
ENTRY main {
  table = f32[100,300] parameter(0)
  tokens = s32[200] parameter(1)
  cache = f32[4,16,64] parameter(2)
  new = f32[4,1,64] parameter(3)
  pos = s32[] parameter(4)
  idx = s32[200,1] reshape(tokens)
  g = f32[200,300] gather(table, idx), offset_dims={1}, collapsed_slice_dims={0}, start_index_map={0},
    index_vector_dim=1, slice_sizes={1,300}
  z = s32[] constant(0)
  u = f32[4,16,64] dynamic-update-slice(cache, new, z, pos, z)
  s = f32[4,3,64] dynamic-slice(u, z, pos, z), dynamic_slice_sizes={4,3,64}
  ROOT out = (f32[200,300], f32[4,16,64], f32[4,3,64]) tuple(g, u, s)
}
""",
    lambda rng: [rng.standard_normal((100, 300)).astype(np.float32),
                 rng.integers(-5, 105, 200).astype(np.int32),
                 rng.standard_normal((4, 16, 64)).astype(np.float32),
                 rng.standard_normal((4, 1, 64)).astype(np.float32), np.int32(14)],
    lambda table, tokens, cache, new, pos: _indexed_reference(table, tokens, cache, new, int(pos)),
)


# windows whose starts are computed in several dimensions, or in one while the window is part of
# another: one dimension at a time (rows of the first, then the window of those), each start clamped;
# and an update that is one constant (`x.at[i:i+2].set(7)`: a splat, no tensor of its own)
RUNTIME_WINDOWS = Case(
    "runtime_windows",
    """HloModule runtime_windows
ENTRY main {
  x = f32[37,129] parameter(0)
  i = s32[] parameter(1)
  j = s32[] parameter(2)
  v = f32[6,40,9] parameter(3)
  u = f32[5,17] parameter(4)
  c = s32[] constant(2)
  a = f32[5,17] dynamic-slice(x, i, j), dynamic_slice_sizes={5,17}
  b = f32[3,7,4] dynamic-slice(v, c, j, i), dynamic_slice_sizes={3,7,4}
  d = f32[37,129] dynamic-update-slice(x, u, i, j)
  e = f32[37,129] dynamic-update-slice(x, u, c, j)
  z = s32[] constant(0)
  seven = f32[] constant(7)
  rows = f32[2,129] broadcast(seven), dimensions={}
  cols = f32[37,3] broadcast(seven), dimensions={}
  f = f32[37,129] dynamic-update-slice(x, rows, i, z)
  g = f32[37,129] dynamic-update-slice(x, cols, z, j)
  ROOT out = (f32[5,17], f32[3,7,4], f32[37,129], f32[37,129], f32[37,129], f32[37,129])
    tuple(a, b, d, e, f, g)
}
""",
    lambda rng: [rng.standard_normal((37, 129)).astype(np.float32), np.int32(35), np.int32(-4),
                 rng.standard_normal((6, 40, 9)).astype(np.float32),
                 rng.standard_normal((5, 17)).astype(np.float32)],
    lambda x, i, j, v, u: _runtime_windows_reference(x, int(i), int(j), v, u),
)


def _runtime_windows_reference(x, i, j, v, u):
    def at(start: int, extent: int, size: int) -> int:
        return min(max(start, 0), extent - size)
    a = x[at(i, 37, 5):at(i, 37, 5) + 5, at(j, 129, 17):at(j, 129, 17) + 17]
    b = v[2:5, at(j, 40, 7):at(j, 40, 7) + 7, at(i, 9, 4):at(i, 9, 4) + 4]
    d = _updated(x, u, at(i, 37, 5), at(j, 129, 17))
    e = _updated(x, u, 2, at(j, 129, 17))
    f = _updated(x, np.full((2, 129), 7, np.float32), at(i, 37, 2), 0)
    g = _updated(x, np.full((37, 3), 7, np.float32), 0, at(j, 129, 3))
    return a, b, d, e, f, g


def _indexed_reference(table, tokens, cache, new, pos):
    updated = cache.copy()
    at = min(max(pos, 0), 15)
    updated[:, at:at + 1] = new
    window = min(max(pos, 0), 13)
    return table[np.clip(tokens, 0, 99)], updated, updated[:, window:window + 3]


def _scatter_reference(x, rows, updates, table, columns, values):
    added = x.astype(np.float64)
    for k, row in enumerate(rows[:, 0]):
        if 0 <= row < x.shape[0]:
            added[row] += updates[k]
    maxed = table.copy()
    for k, column in enumerate(columns):
        if 0 <= column < table.shape[1]:
            maxed[:, column] = np.maximum(maxed[:, column], values[:, k])
    return added, maxed


# scatter with repeated, negative and out-of-range rows (combined in order, or skipped), and into
# a non-leading dimension with an integer max
SCATTERS = Case(
    "scatters",
    """HloModule scatters
add {
  a = f32[] parameter(0)
  b = f32[] parameter(1)
  ROOT s = f32[] add(a, b)
}
mx {
  a = s32[] parameter(0)
  b = s32[] parameter(1)
  ROOT s = s32[] maximum(a, b)
}
ENTRY main {
  x = f32[10,3,8] parameter(0)
  idx = s32[6,1] parameter(1)
  upd = f32[6,3,8] parameter(2)
  y = f32[10,3,8] scatter(x, idx, upd), update_window_dims={1,2}, inserted_window_dims={0},
    scatter_dims_to_operand_dims={0}, index_vector_dim=1, to_apply=add
  t = s32[7,20] parameter(3)
  cols = s32[4] parameter(4)
  u = s32[7,4] parameter(5)
  z = s32[7,20] scatter(t, cols, u), update_window_dims={0}, inserted_window_dims={1},
    scatter_dims_to_operand_dims={1}, index_vector_dim=1, to_apply=mx
  ROOT out = (f32[10,3,8], s32[7,20]) tuple(y, z)
}
""",
    lambda rng: [rng.standard_normal((10, 3, 8)).astype(np.float32),
                 np.array([[1], [4], [1], [-1], [9], [12]], dtype=np.int32),
                 rng.standard_normal((6, 3, 8)).astype(np.float32),
                 rng.integers(-50, 50, (7, 20)).astype(np.int32), np.array([3, 19, 3, 25], dtype=np.int32),
                 rng.integers(-50, 50, (7, 4)).astype(np.int32)],
    _scatter_reference,
)


SEGMENT_SUM_HLO = """HloModule segment_sums
add {
  a = f32[] parameter(0)
  b = f32[] parameter(1)
  ROOT s = f32[] add(a, b)
}
ENTRY main {
  msg = f32[2000,64] parameter(0)
  dst = s32[2000,1] parameter(1)
  zero = f32[] constant(0)
  nodes = f32[500,64] broadcast(zero), dimensions={}
  sums = f32[500,64] scatter(nodes, dst, msg), update_window_dims={1}, inserted_window_dims={0},
    scatter_dims_to_operand_dims={0}, index_vector_dim=1, to_apply=add
  bags = f32[37,5,3] parameter(2)
  ids = s32[300,1] parameter(3)
  rows = f32[300,5,3] parameter(4)
  bagged = f32[37,5,3] scatter(bags, ids, rows), update_window_dims={1,2}, inserted_window_dims={0},
    scatter_dims_to_operand_dims={0}, index_vector_dim=1, to_apply=add
  three = s32[] constant(3)
  all_to_three = s32[300,1] broadcast(three), dimensions={}
  one_bag = f32[37,5,3] scatter(bags, all_to_three, rows), update_window_dims={1,2},
    inserted_window_dims={0}, scatter_dims_to_operand_dims={0}, index_vector_dim=1, to_apply=add
  ROOT out = (f32[500,64], f32[37,5,3], f32[37,5,3]) tuple(sums, bagged, one_bag)
}
"""


def _segment_sums_reference(msg, dst, bags, ids, rows):
    sums = np.zeros((500, 64))
    bagged = bags.astype(np.float64)
    for i, node in enumerate(dst[:, 0]):
        sums[node] += msg[i]
    for i, bag in enumerate(ids[:, 0]):
        if 0 <= bag < 37:
            bagged[bag] += rows[i]
    one_bag = bags.astype(np.float64)
    one_bag[3] += rows.astype(np.float64).sum(axis=0)
    return sums, bagged, one_bag


# segment sums (a GNN's messages by destination node; embedding bags into a non-zero table, ids out
# of range skipped; every row into one bag, a constant index): one one-hot matmul on PE instead of
# a gather, add and scatter per row
SEGMENT_SUMS = Case(
    "segment_sums",
    SEGMENT_SUM_HLO,
    lambda rng: [rng.standard_normal((2000, 64)).astype(np.float32),
                 rng.integers(0, 500, (2000, 1)).astype(np.int32),
                 rng.standard_normal((37, 5, 3)).astype(np.float32),
                 rng.integers(-3, 40, (300, 1)).astype(np.int32),
                 rng.standard_normal((300, 5, 3)).astype(np.float32)],
    _segment_sums_reference,
)


def test_a_segment_sum_is_a_matmul_not_a_row_at_a_time() -> None:
    """Past ONE_HOT_MAX_ELEMENTS of one-hot matrix (here 8 rows into 600,000) the rows still go one
    at a time with POOL's indirect dmas; within it, one matmul and no indirect dma."""
    from ncc.tools.hlo.hlo_text import parse_hlo_text
    from ncc.tools.hlo2penguin.lower import lower_module

    def ops(text: str) -> list[str]:
        return [st.op for nest in lower_module(parse_hlo_text(text)).nests for st in nest.statements]

    small = ops(SEGMENT_SUM_HLO)
    assert "matmul" in small and "dma_scatter" not in small
    large = ops(SEGMENT_SUM_HLO.replace("f32[500,64]", "f32[600000,64]").replace("[2000,", "[8,"))
    assert "dma_scatter" in large


# jax.checkpoint (remat) wraps what a gradient recomputes in opt-barrier: a tuple or an array,
# passed through unchanged
OPT_BARRIER = Case(
    "opt_barrier",
    _module("opt_barrier", ["f32[16,64]", "f32[64,48]"], [
        "t = (f32[16,64], f32[64,48]) tuple(p0, p1)",
        "b = (f32[16,64], f32[64,48]) opt-barrier(t)",
        "x = f32[16,64] get-tuple-element(b), index=0",
        "w = f32[64,48] get-tuple-element(b), index=1",
        "d = f32[16,48] dot(x, w), lhs_contracting_dims={1}, rhs_contracting_dims={0}",
        "e = f32[16,48] opt-barrier(d)",
        "y = f32[16,48] tanh(e)",
    ], ["f32[16,48] y"]),
    lambda rng: [rng.standard_normal((16, 64)).astype(np.float32),
                 rng.standard_normal((64, 48)).astype(np.float32)],
    lambda x, w: np.tanh(x.astype(np.float64) @ w),
)


# constant row numbers (one value, or one value repeated): the index tensor is written by a nest
# of its own, which must come before the gather or scatter that reads it (it once came after,
# and every such index read row 0: `x.at[3].set(y)`, `jnp.take(x, 3)`, jnp.median's picks)
CONSTANT_INDICES = Case(
    "constant_indices",
    """HloModule constant_indices
keep_new {
  a = f32[] parameter(0)
  ROOT b = f32[] parameter(1)
}
ENTRY main {
  x = f32[6,4] parameter(0)
  y = f32[4] parameter(1)
  a = f32[16] parameter(2)
  three = s32[1] constant({3})
  set = f32[6,4] scatter(x, three, y), update_window_dims={0}, inserted_window_dims={0},
    scatter_dims_to_operand_dims={0}, index_vector_dim=0, indices_are_sorted=true, unique_indices=true,
    to_apply=keep_new
  two = s32[1] constant({2})
  column = f32[6] gather(x, two), offset_dims={0}, collapsed_slice_dims={1}, start_index_map={1},
    index_vector_dim=0, slice_sizes={6,1}
  eight = s32[] constant(8)
  eights = s32[9] broadcast(eight), dimensions={}
  rows = s32[9,1] reshape(eights)
  picked = f32[9] gather(a, rows), offset_dims={}, collapsed_slice_dims={0}, start_index_map={0},
    index_vector_dim=1, slice_sizes={1}
  ROOT out = (f32[6,4], f32[6], f32[9]) tuple(set, column, picked)
}
""",
    lambda rng: [rng.standard_normal((6, 4)).astype(np.float32), rng.standard_normal(4).astype(np.float32),
                 rng.standard_normal(16).astype(np.float32)],
    lambda x, y, a: (np.concatenate([x[:3], y[None], x[4:]]), x[:, 2], np.full(9, a[8])),
)


def _with_infinities(x: np.ndarray) -> np.ndarray:
    """Row 0 all -inf but two values: top-5 must then pick -inf entries by lowest index."""
    x = x.copy()
    x[0, 2:] = -np.inf
    return x


def _sort_reference(x, keys):
    order = np.argsort(-x.astype(np.float64), axis=-1, kind="stable")[:, :5]
    by_key = np.argsort(keys, axis=0, kind="stable")
    return (np.sort(x, axis=-1), np.argsort(x, axis=0, kind="stable").astype(np.int32),
            np.take_along_axis(x, order, axis=-1), order.astype(np.int32),
            np.take_along_axis(keys, by_key, axis=0), np.take_along_axis(x, by_key, axis=0))


# jnp.sort, jnp.argsort (stable, down a column), lax.top_k and a two-operand sort by integer keys
# with many ties (stability decides), on widths that are not powers of two
SORTING = Case(
    "sorting",
    """HloModule sorting
less {
  a = f32[] parameter(0)
  b = f32[] parameter(1)
  ROOT lt = pred[] compare(a, b), direction=LT
}
less_by_first {
  a = f32[] parameter(0)
  b = f32[] parameter(1)
  i = s32[] parameter(2)
  j = s32[] parameter(3)
  ROOT lt = pred[] compare(a, b), direction=LT
}
keys_first {
  a = s32[] parameter(0)
  b = s32[] parameter(1)
  i = f32[] parameter(2)
  j = f32[] parameter(3)
  ROOT lt = pred[] compare(a, b), direction=LT
}
ENTRY main {
  x = f32[6,37] parameter(0)
  keys = s32[6,37] parameter(1)
  s = f32[6,37] sort(x), dimensions={1}, is_stable=true, to_apply=less
  rows = s32[6,37] iota(), iota_dimension=0
  a = (f32[6,37], s32[6,37]) sort(x, rows), dimensions={0}, is_stable=true, to_apply=less_by_first
  ai = s32[6,37] get-tuple-element(a), index=1
  t = (f32[6,5], s32[6,5]) topk(x), k=5, largest=true
  tv = f32[6,5] get-tuple-element(t), index=0
  ti = s32[6,5] get-tuple-element(t), index=1
  k = (s32[6,37], f32[6,37]) sort(keys, x), dimensions={0}, is_stable=true, to_apply=keys_first
  kk = s32[6,37] get-tuple-element(k), index=0
  kx = f32[6,37] get-tuple-element(k), index=1
  ROOT out = (f32[6,37], s32[6,37], f32[6,5], s32[6,5], s32[6,37], f32[6,37]) tuple(s, ai, tv, ti, kk, kx)
}
""",
    lambda rng: [_with_infinities((np.round(rng.standard_normal((6, 37)) * 2) / 2).astype(np.float32)),
                 rng.integers(0, 3, (6, 37)).astype(np.int32)],
    _sort_reference,
)


def _largest_first(row: np.ndarray) -> list[int]:
    """Positions of a row from the largest value in total order (NaN first), the lower index
    first among equals."""
    nan = np.isnan(row)
    return sorted(range(len(row)), key=lambda i: (not nan[i], 0.0 if nan[i] else -row[i], i))


def _nan_order_reference(x):
    rows = np.argsort(x, axis=0, kind="stable").astype(np.int32)  # numpy too puts NaN last
    top = np.array([_largest_first(row) for row in x], dtype=np.int32)
    return (np.sort(x, axis=-1), rows, np.take_along_axis(x, top[:, :3], -1), top[:, :3],
            np.take_along_axis(x, top[:, :20], -1), top[:, :20])


# JAX's comparators are compare(..., type=TOTALORDER): NaN sorts after +inf (it once landed
# anywhere), and top-k takes NaN as the largest, by selection (k = 3) and by sorting (k = 20)
NAN_ORDER = Case(
    "nan_order",
    """HloModule nan_order
total_less {
  a = f32[] parameter(0)
  b = f32[] parameter(1)
  ROOT lt = pred[] compare(a, b), direction=LT, type=TOTALORDER
}
total_less_by_first {
  a = f32[] parameter(0)
  b = f32[] parameter(1)
  i = s32[] parameter(2)
  j = s32[] parameter(3)
  ROOT lt = pred[] compare(a, b), direction=LT, type=TOTALORDER
}
ENTRY main {
  x = f32[5,37] parameter(0)
  s = f32[5,37] sort(x), dimensions={1}, is_stable=true, to_apply=total_less
  rows = s32[5,37] iota(), iota_dimension=0
  a = (f32[5,37], s32[5,37]) sort(x, rows), dimensions={0}, is_stable=true, to_apply=total_less_by_first
  ai = s32[5,37] get-tuple-element(a), index=1
  t = (f32[5,3], s32[5,3]) topk(x), k=3, largest=true
  tv = f32[5,3] get-tuple-element(t), index=0
  ti = s32[5,3] get-tuple-element(t), index=1
  u = (f32[5,20], s32[5,20]) topk(x), k=20, largest=true
  uv = f32[5,20] get-tuple-element(u), index=0
  ui = s32[5,20] get-tuple-element(u), index=1
  ROOT out = (f32[5,37], s32[5,37], f32[5,3], s32[5,3], f32[5,20], s32[5,20]) tuple(s, ai, tv, ti, uv, ui)
}
""",
    lambda rng: [np.where(rng.random((5, 37)) < 0.15, np.nan,
                          _with_infinities(np.round(rng.standard_normal((5, 37)) * 2) / 2 + 0.25))
                 .astype(np.float32)],
    _nan_order_reference,
)


def _total_order(x: np.ndarray) -> np.ndarray:
    bits = x.view(np.int32).astype(np.int64)
    return np.where(bits < 0, bits ^ 0x7FFFFFFF, bits)


def _top(x: np.ndarray, k: int, largest: bool) -> tuple[np.ndarray, np.ndarray]:
    """The k largest (smallest) of each row in IEEE total order, the lower index first among equals."""
    keys = _total_order(x)
    order = np.array([np.lexsort((np.arange(len(row)), -row if largest else row))[:k] for row in keys])
    return np.take_along_axis(x, order, 1), order.astype(np.int32)


# top-k of long rows by a tournament: rows cut into chunks, each chunk's k best kept by a sort of
# many short rows, then a sort of those (here 1,000 -> chunks of 64 -> 128 -> a final sort), over
# ties, signed zeros, infinities and NaNs of both signs
TOURNAMENT = Case(
    "tournament",
    """HloModule tournament
ENTRY main {
  x = f32[3,1000] parameter(0)
  t = (f32[3,17], s32[3,17]) topk(x), k=17, largest=true
  tv = f32[3,17] get-tuple-element(t), index=0
  ti = s32[3,17] get-tuple-element(t), index=1
  u = (f32[3,30], s32[3,30]) topk(x), k=30, largest=false
  uv = f32[3,30] get-tuple-element(u), index=0
  ui = s32[3,30] get-tuple-element(u), index=1
  ROOT out = (f32[3,17], s32[3,17], f32[3,30], s32[3,30]) tuple(tv, ti, uv, ui)
}
""",
    lambda rng: [rng.choice(np.array([np.nan, -np.nan, -0.0, 0.0, np.inf, -np.inf, 1.5, -2.0, 0.25, 7.0],
                                     dtype=np.float32), (3, 1000),
                            p=[.01, .01, .1, .1, .01, .01, .3, .3, .1, .06])],
    lambda x: (*_top(x, 17, True), *_top(x, 30, False)),
)


_JAX_KEYS = """  a = f32[] parameter(0)
  nan_a = pred[] compare(a, a), direction=NE
  qnan = f32[] constant(nan)
  zero = f32[] constant(0)
  zero_a = pred[] compare(a, zero), direction=EQ
  a0 = f32[] select(zero_a, zero, a)
  ka = f32[] select(nan_a, qnan, a0)
  b = f32[] parameter(1)
  nan_b = pred[] compare(b, b), direction=NE
  zero_b = pred[] compare(b, zero), direction=EQ
  b0 = f32[] select(zero_b, zero, b)
  kb = f32[] select(nan_b, qnan, b0)
"""
_JAX_ROOT = "  ROOT lt = pred[] compare(ka, kb), direction=LT, type=TOTALORDER\n}\n"
# jax_less, as JAX writes jnp.sort's comparator, and jax_less_by_first for argsort's (x, iota)
JAX_LESS = ("jax_less {\n" + _JAX_KEYS + _JAX_ROOT + "jax_less_by_first {\n" + _JAX_KEYS
            + "  i = s32[] parameter(2)\n  j = s32[] parameter(3)\n" + _JAX_ROOT)


def _jax_sort_reference(x):
    """jnp.sort and jnp.argsort: NaN (of any sign) after +inf, -0 and +0 one key, ties in order."""
    def order(row: np.ndarray) -> list[int]:
        nan = np.isnan(row)
        return sorted(range(len(row)), key=lambda i: (bool(nan[i]), 0.0 if nan[i] else float(row[i]), i))
    rows = np.array([order(row) for row in x])
    columns = np.array([order(column) for column in x.T]).T
    return np.take_along_axis(x, rows, 1), columns.astype(np.int32)


# JAX's own comparator: NaN canonicalized and -0 made +0 on each side before a TOTALORDER compare
# (the sort applies that once per element, not in every comparison), over signed NaNs and zeros
JAX_SORTS = Case(
    "jax_sorts",
    "HloModule jax_sorts\n" + JAX_LESS + """ENTRY main {
  x = f32[5,37] parameter(0)
  s = f32[5,37] sort(x), dimensions={1}, is_stable=true, to_apply=jax_less
  rows = s32[5,37] iota(), iota_dimension=0
  a = (f32[5,37], s32[5,37]) sort(x, rows), dimensions={0}, is_stable=true, to_apply=jax_less_by_first
  ai = s32[5,37] get-tuple-element(a), index=1
  ROOT out = (f32[5,37], s32[5,37]) tuple(s, ai)
}
""",
    lambda rng: [rng.choice(np.array([np.nan, -np.nan, -0.0, 0.0, np.inf, -np.inf, 1.5, -2.0, 0.25],
                                     dtype=np.float32), (5, 37))],
    _jax_sort_reference,
)


def _bits_reference(a, b, c, d, x, words):
    """s16/u16/s64/u64 arithmetic wraps and compares as XLA's does; popcnt, clz, bitcast-convert."""
    def clz(values, width):
        return np.array([width - int(v).bit_length() for v in values.reshape(-1)]).reshape(values.shape)

    big = np.uint64(0xFFFFFFFFFFFFFFC5)  # past 2**53: no double holds it
    with np.errstate(over="ignore"):
        s16 = ((a.astype(np.int64) * 1000 + a) & 0xFFFF).astype(np.uint16).view(np.int16)
        s64_product = (c.view(np.uint64) * np.uint64(0x9E3779B97F4A7C15)).view(np.int64)
    return (s16, (b - np.uint16(40000)).astype(np.uint16), np.trunc(a / np.int16(-7)).astype(np.int16),
            s64_product, (c + np.int64(9007199254740993)), c.astype(np.int32),
            (d < big), d // np.uint64(7), d >> np.uint64(60), d.astype(np.float32),
            np.bitwise_count(a.view(np.uint16)).astype(np.int16), clz(b, 16).astype(np.uint16),
            np.bitwise_count(c.view(np.uint64)).astype(np.int64), clz(d, 64).astype(np.uint64),
            x.view(np.int32), c.view(np.float32).reshape(c.shape + (2,)), words.view(np.float32)[..., 0],
            c.sum(axis=1))


BITS = Case(
    "bits",
    _module("bits", ["s16[130,33]", "u16[130,33]", "s64[7,300]", "u64[7,300]", "f32[130,33]", "u8[5,4]"], [
        "k1 = s16[] constant(1001)",
        "k1b = s16[130,33] broadcast(k1), dimensions={}",
        "s16m = s16[130,33] multiply(p0, k1b)",
        "k2 = u16[] constant(40000)",
        "k2b = u16[130,33] broadcast(k2), dimensions={}",
        "u16s = u16[130,33] subtract(p1, k2b)",
        "k3 = s16[] constant(-7)",
        "k3b = s16[130,33] broadcast(k3), dimensions={}",
        "s16d = s16[130,33] divide(p0, k3b)",
        "k4 = s64[] constant(-7046029254386353131)",
        "k4b = s64[7,300] broadcast(k4), dimensions={}",
        "s64m = s64[7,300] multiply(p2, k4b)",
        "k5 = s64[] constant(9007199254740993)",
        "k5b = s64[7,300] broadcast(k5), dimensions={}",
        "s64a = s64[7,300] add(p2, k5b)",
        "s64n = s32[7,300] convert(p2)",
        "k6 = u64[] constant(18446744073709551557)",
        "k6b = u64[7,300] broadcast(k6), dimensions={}",
        "u64lt = pred[7,300] compare(p3, k6b), direction=LT",
        "k7 = u64[] constant(7)",
        "k7b = u64[7,300] broadcast(k7), dimensions={}",
        "u64d = u64[7,300] divide(p3, k7b)",
        "k8 = u64[] constant(60)",
        "k8b = u64[7,300] broadcast(k8), dimensions={}",
        "u64r = u64[7,300] shift-right-logical(p3, k8b)",
        "u64f = f32[7,300] convert(p3)",
        "pc16 = s16[130,33] popcnt(p0)",
        "cz16 = u16[130,33] count-leading-zeros(p1)",
        "pc64 = s64[7,300] popcnt(p2)",
        "cz64 = u64[7,300] count-leading-zeros(p3)",
        "fb = s32[130,33] bitcast-convert(p4)",
        "split = f32[7,300,2] bitcast-convert(p2)",
        "joined = f32[5] bitcast-convert(p5)",
        "zero = s64[] constant(0)",
        "sum = s64[7] reduce(p2, zero), dimensions={1}, to_apply=add64",
    ], ["s16[130,33] s16m", "u16[130,33] u16s", "s16[130,33] s16d", "s64[7,300] s64m", "s64[7,300] s64a",
        "s32[7,300] s64n", "pred[7,300] u64lt", "u64[7,300] u64d", "u64[7,300] u64r", "f32[7,300] u64f",
        "s16[130,33] pc16", "u16[130,33] cz16", "s64[7,300] pc64", "u64[7,300] cz64", "s32[130,33] fb",
        "f32[7,300,2] split", "f32[5] joined", "s64[7] sum"]).replace(
        "ENTRY main {", "add64 {\n  a = s64[] parameter(0)\n  b = s64[] parameter(1)\n"
                        "  ROOT s = s64[] add(a, b)\n}\n\nENTRY main {"),
    lambda rng: [rng.integers(-2**15, 2**15, (130, 33)).astype(np.int16),
                 rng.integers(0, 2**16, (130, 33)).astype(np.uint16),
                 rng.integers(-2**63, 2**63, (7, 300), dtype=np.int64),
                 np.concatenate([rng.integers(0, 2**64, (7, 297), dtype=np.uint64),
                                 np.array([[0, 2**64 - 1, 0xFFFFFFFFFFFFFFC5]] * 7, dtype=np.uint64)],
                                axis=1),
                 rng.standard_normal((130, 33)).astype(np.float32),
                 rng.integers(0, 256, (5, 4)).astype(np.uint8)],
    _bits_reference,
)


def _select_and_scatter_reference(x, source, y, grad):
    """Each window (3x2, strides 2x1, padding 1/1 and 0/1 on the last two dims) picks its last
    maximum (select is GT, so ties move on); the chosen element gets init 0.5 plus its sources.
    Then a max-pool gradient over 300 rows with a size-1 dimension: 2x1x3 windows, no overlap,
    the first maximum (GE) of each gets its gradient."""
    pooled = np.zeros(y.shape, dtype=np.float32)
    for w in np.ndindex(*grad.shape):
        block = y[2 * w[0]:2 * w[0] + 2, 0, 3 * w[2]:3 * w[2] + 3]
        a, b = np.unravel_index(np.argmax(block), block.shape)  # argmax: the first maximum
        pooled[2 * w[0] + a, 0, 3 * w[2] + b] += grad[w]
    return _windows_choose_last(x, source), pooled


def _windows_choose_last(x, source):
    out = np.full(x.shape, np.float32(0.5), dtype=np.float32)
    for w in np.ndindex(*source.shape):
        best = None
        for o in np.ndindex(3, 2):
            pos = (w[0], w[1] * 2 + o[0] - 1, w[2] + o[1])
            if not (0 <= pos[1] < x.shape[1] and 0 <= pos[2] < x.shape[2]):
                continue
            if best is None or not x[best] > x[pos]:
                best = pos
        out[best] = out[best] + source[w]
    return out


SELECT_AND_SCATTER = Case(
    "select_and_scatter",
    """HloModule select_and_scatter
gt {
  a = f32[] parameter(0)
  b = f32[] parameter(1)
  ROOT c = pred[] compare(a, b), direction=GT
}
ge {
  a = f32[] parameter(0)
  b = f32[] parameter(1)
  ROOT c = pred[] compare(a, b), direction=GE
}
add {
  a = f32[] parameter(0)
  b = f32[] parameter(1)
  ROOT s = f32[] add(a, b)
}
ENTRY main {
  x = f32[3,7,9] parameter(0)
  g = f32[3,4,9] parameter(1)
  init = f32[] constant(0.5)
  s = f32[3,7,9] select-and-scatter(x, g, init), window={size=1x3x2 stride=1x2x1 pad=0_0x1_1x0_1},
    select=gt, scatter=add
  y = f32[300,1,6] parameter(2)
  h = f32[150,1,2] parameter(3)
  zero = f32[] constant(0)
  t = f32[300,1,6] select-and-scatter(y, h, zero), window={size=2x1x3 stride=2x1x3}, select=ge, scatter=add
  ROOT out = (f32[3,7,9], f32[300,1,6]) tuple(s, t)
}
""",
    lambda rng: [np.round(rng.standard_normal((3, 7, 9)), 0).astype(np.float32),  # many ties
                 rng.standard_normal((3, 4, 9)).astype(np.float32),
                 np.round(rng.standard_normal((300, 1, 6)), 0).astype(np.float32),
                 rng.standard_normal((150, 1, 2)).astype(np.float32)],
    _select_and_scatter_reference,
)


def _elements_reference(x, labels, i, j, u):
    """take_along_axis, clamped point and window gathers, a scatter-add with repeats (out-of-range
    points skipped) and a put_along_axis, all on the [130,7,5] / [130,7] operands."""
    plane = x[:, :, 0]
    ci, cj = np.clip(i, 0, 129), np.clip(j, 0, 6)
    wi, wj = np.clip(i, 0, 128), np.clip(j, 0, 4)
    windows = np.stack([plane[a:a + 2, b:b + 3] for a, b in zip(wi, wj, strict=True)])
    added = plane.copy()
    for a, b, v in zip(i, j, u, strict=True):
        if 0 <= a < 130 and 0 <= b < 7:
            added[a, b] = added[a, b] + v
    put = x.copy()
    np.put_along_axis(put, labels[..., None], plane[..., None], axis=2)
    return (np.take_along_axis(x, labels[..., None], axis=2)[..., 0], plane[ci, cj], windows, added, put)


ELEMENTS = Case(
    "gather_scatter_elements",
    """HloModule gather_scatter_elements
add {
  a = f32[] parameter(0)
  b = f32[] parameter(1)
  ROOT s = f32[] add(a, b)
}
second {
  a = f32[] parameter(0)
  ROOT b = f32[] parameter(1)
}
ENTRY main {
  x = f32[130,7,5] parameter(0)
  labels = s32[130,7] parameter(1)
  i = s32[60] parameter(2)
  j = s32[60] parameter(3)
  u = f32[60] parameter(4)
  l3 = s32[130,7,1] reshape(labels)
  picked = f32[130,7] gather(x, l3), offset_dims={}, collapsed_slice_dims={2}, start_index_map={2},
    operand_batching_dims={0,1}, start_indices_batching_dims={0,1}, index_vector_dim=2, slice_sizes={1,1,1}
  s = f32[130,7,1] slice(x), slice={[0:130], [0:7], [0:1]}
  plane = f32[130,7] reshape(s)
  i2 = s32[60,1] reshape(i)
  j2 = s32[60,1] reshape(j)
  ij = s32[60,2] concatenate(i2, j2), dimensions={1}
  points = f32[60] gather(plane, ij), offset_dims={}, collapsed_slice_dims={0,1}, start_index_map={0,1},
    index_vector_dim=1, slice_sizes={1,1}
  windows = f32[60,2,3] gather(plane, ij), offset_dims={1,2}, collapsed_slice_dims={}, start_index_map={0,1},
    index_vector_dim=1, slice_sizes={2,3}
  added = f32[130,7] scatter(plane, ij, u), update_window_dims={}, inserted_window_dims={0,1},
    scatter_dims_to_operand_dims={0,1}, index_vector_dim=1, to_apply=add
  put = f32[130,7,5] scatter(x, l3, plane), update_window_dims={}, inserted_window_dims={2},
    scatter_dims_to_operand_dims={2}, input_batching_dims={0,1}, scatter_indices_batching_dims={0,1},
    index_vector_dim=2, unique_indices=true, to_apply=second
  ROOT out = (f32[130,7], f32[60], f32[60,2,3], f32[130,7], f32[130,7,5]) tuple(picked, points, windows,
    added, put)
}
""",
    lambda rng: [rng.standard_normal((130, 7, 5)).astype(np.float32),
                 rng.integers(0, 5, (130, 7)).astype(np.int32),
                 np.concatenate([rng.integers(0, 130, 50),
                                 [-3, 200, 129, 0, 5, 5, 5, 7, 7, 128]]).astype(np.int32),
                 np.concatenate([rng.integers(0, 7, 50), [1, 2, 6, 9, -1, 3, 3, 3, 0, 6]]).astype(np.int32),
                 rng.standard_normal(60).astype(np.float32)],
    _elements_reference,
)

def _keyed_rows_reference(buffers, expert, slot, x, plane):
    """MoE's dispatch and combine on [E=5, C=7, d=130] buffers: a set of whole rows keyed by
    (expert, slot), later writes winning, an out-of-range coordinate skipping the row (slot 7 is
    not expert + 1's slot 0); a gather of the same rows with every coordinate clamped; and a
    gather keyed by two non-leading dimensions, out of order, of a [4, 130, 6] operand."""
    put = buffers.copy()
    for e, c, row in zip(expert, slot, x, strict=True):
        if 0 <= e < 5 and 0 <= c < 7:
            put[e, c] = row
    back = put[np.clip(expert, 0, 4), np.clip(slot, 0, 6)]
    keys = np.stack([slot, expert], axis=1)  # (k2 on dim 2, k0 on dim 0)
    columns = np.stack([plane[np.clip(e, 0, 3), :, np.clip(c, 0, 5)] for c, e in keys])
    return put, back, columns


# whole rows keyed by two dimensions (MoE's buffers.at[expert, slot].set(x) and results[expert, slot]):
# one row number per index vector and one row dma, not one dma per element
KEYED_ROWS = Case(
    "keyed_rows",
    """HloModule keyed_rows
second {
  a = f32[] parameter(0)
  ROOT b = f32[] parameter(1)
}
ENTRY main {
  buffers = f32[5,7,130] parameter(0)
  expert = s32[12] parameter(1)
  slot = s32[12] parameter(2)
  x = f32[12,130] parameter(3)
  plane = f32[4,130,6] parameter(4)
  e2 = s32[12,1] reshape(expert)
  c2 = s32[12,1] reshape(slot)
  keys = s32[12,2] concatenate(e2, c2), dimensions={1}
  put = f32[5,7,130] scatter(buffers, keys, x), update_window_dims={1}, inserted_window_dims={0,1},
    scatter_dims_to_operand_dims={0,1}, index_vector_dim=1, to_apply=second
  back = f32[12,130] gather(put, keys), offset_dims={1}, collapsed_slice_dims={0,1}, start_index_map={0,1},
    index_vector_dim=1, slice_sizes={1,1,130}
  swapped = s32[12,2] concatenate(c2, e2), dimensions={1}
  columns = f32[12,130] gather(plane, swapped), offset_dims={1}, collapsed_slice_dims={0,2},
    start_index_map={2,0}, index_vector_dim=1, slice_sizes={1,130,1}
  ROOT out = (f32[5,7,130], f32[12,130], f32[12,130]) tuple(put, back, columns)
}
""",
    lambda rng: [rng.standard_normal((5, 7, 130)).astype(np.float32),
                 np.array([0, 4, 2, 2, -1, 1, 3, 0, 5, 4, 2, 1], dtype=np.int32),
                 np.array([0, 6, 3, 3, 2, 7, 0, 6, 1, -2, 3, 0], dtype=np.int32),
                 rng.standard_normal((12, 130)).astype(np.float32),
                 rng.standard_normal((4, 130, 6)).astype(np.float32)],
    _keyed_rows_reference,
)


# rng-bit-generator: what XLA:CPU (jaxlib 0.10.2) gives for these states, written down here so the
# reference owes nothing to ncc's own tools/hlo/rng_bits.py. The u64[2] rows are
# jax.lax.rng_bit_generator(RNG_STATE, shape, dtype, algorithm) on CPU (rng_default gave the same
# bits and state as rng_philox: XLA:CPU runs Philox for it); the u64[3] row is the HLO
# `(u64[3], u32[2,3]) rng-bit-generator(s), algorithm=rng_philox` compiled by jaxlib's XLA:CPU.
# The counters wrap past 2**64 (and carry into the high half of Philox's 128-bit counter).
RNG_STATE = np.array([0x0123456789ABCDEF, 0xFFFFFFFFFFFFFFFD], dtype=np.uint64)
RNG_STATE3 = np.array([0x0123456789ABCDEF, 0xFFFFFFFFFFFFFFFF, 0x00000000FFFFFFFF], dtype=np.uint64)
_PHILOX_U32 = np.array([
    0x5CCE3967, 0x0A44081D, 0xD9AE917C, 0x7BAB4396, 0x0A485194, 0x41C5F806, 0xD6822FEE,
    0x3885A3D4, 0x41EB59F3, 0x307385E0, 0x5B8B3389, 0xA262F67C, 0x7006D264, 0xD71FD4DE,
    0x3AFF468E, 0x40B5F768, 0x34DA5D11, 0xA2A4E857, 0xFC81D5F9, 0x7885CD87, 0xDF0B0A26,
], dtype=np.uint32).reshape(3, 7)
_PHILOX_U64 = np.array([0x0A44081D5CCE3967, 0x7BAB4396D9AE917C, 0x41C5F8060A485194, 0x3885A3D4D6822FEE,
                        0x307385E041EB59F3], dtype=np.uint64)
_THREEFRY_U32 = np.array([
    0x3FC5955F, 0x7E39C6DC, 0xB0F4215B, 0xE19A60B4, 0x0B3D7494, 0xACF8C4DC, 0xAAA4D889,
    0x75A52907, 0xD3DD8613, 0x35D0E5F1, 0x8ED17FE4, 0x7C2F19D8, 0x0284DBE3, 0xDE79BBBD,
    0xB09D029E, 0x7D84F441, 0x6CA3E732, 0xA43B6B39, 0xC8124617, 0x2077496E, 0xB530F815,
], dtype=np.uint32).reshape(3, 7)
_THREEFRY_U64 = np.array([0x7E39C6DC3FC5955F, 0xE19A60B4B0F4215B, 0xACF8C4DC0B3D7494, 0x6B35C4F4AAA4D889,
                          0xD3DD861375A52907], dtype=np.uint64)
_KEY = 0x0123456789ABCDEF
RNG_EXPECTED = [  # (algorithm, state, new state, bits)
    ("rng_default", RNG_STATE, np.array([_KEY, 3], dtype=np.uint64), _PHILOX_U32),
    ("rng_three_fry", RNG_STATE, np.array([_KEY, 9], dtype=np.uint64), _THREEFRY_U32),
    ("rng_philox", RNG_STATE, np.array([_KEY, 3], dtype=np.uint64), _PHILOX_U32),
    ("rng_default", RNG_STATE, np.array([_KEY, 0], dtype=np.uint64), _PHILOX_U64),
    ("rng_three_fry", RNG_STATE, np.array([_KEY, 2], dtype=np.uint64), _THREEFRY_U64),
    ("rng_philox", RNG_STATE, np.array([_KEY, 0], dtype=np.uint64), _PHILOX_U64),
    ("rng_philox", RNG_STATE3, np.array([_KEY, 1, 0x100000000], dtype=np.uint64),
     np.array([0x5890E3E5, 0x1A2AC01D, 0x467C6791, 0x232391F7, 0xD0E1FE69, 0xFEE38B5F],
              dtype=np.uint32).reshape(2, 3)),
]


def _hlo_type(array: np.ndarray) -> str:
    return f"{'u32' if array.dtype == np.uint32 else 'u64'}[{','.join(map(str, array.shape))}]"


def _random_module() -> str:
    lines, results = [], []
    for k, (algorithm, state, _, bits) in enumerate(RNG_EXPECTED):
        source, kind = ("p1", "u64[3]") if len(state) == 3 else ("p0", "u64[2]")
        lines += [f"r{k} = ({kind}, {_hlo_type(bits)}) rng-bit-generator({source}), algorithm={algorithm}",
                  f"s{k} = {kind} get-tuple-element(r{k}), index=0",
                  f"b{k} = {_hlo_type(bits)} get-tuple-element(r{k}), index=1"]
        results += [f"{kind} s{k}", f"{_hlo_type(bits)} b{k}"]
    return _module("random", ["u64[2]", "u64[3]"], lines, results)


RANDOM = Case(
    "random",
    _random_module(),
    lambda _rng: [RNG_STATE, RNG_STATE3],
    lambda *_: tuple(array for _, _, state, bits in RNG_EXPECTED for array in (state, bits)),
)

# float -> integer converts saturate (XLA's semantics): NaN is 0, ±inf and out-of-range values clip
_EDGES = np.array([1.5, -1.0, -2.7, 300.0, 3e9, -3e9, 2147483648.0, 4.3e9, np.inf, -np.inf, np.nan, 255.9,
                   -128.5, 65535.0], dtype=np.float32)
_SATURATING = [("s32", np.int32), ("u32", np.uint32), ("s8", np.int8), ("u8", np.uint8), ("s16", np.int16),
               ("u16", np.uint16)]


def _saturated(x: np.ndarray, kind: type) -> np.ndarray:
    info = np.iinfo(kind)
    values = [0 if np.isnan(v) else info.max if v >= info.max else info.min if v <= info.min
              else int(np.trunc(v)) for v in x.astype(np.float64).ravel()]
    return np.array(values, dtype=kind).reshape(x.shape)


SATURATING_CONVERTS = Case(
    "saturating_converts",
    _module("saturating_converts", ["f32[2,14]"],
            [f"c{k} = {name}[2,14] convert(p0)" for k, (name, _) in enumerate(_SATURATING)],
            [f"{name}[2,14] c{k}" for k, (name, _) in enumerate(_SATURATING)]),
    lambda _rng: [np.stack([_EDGES, -_EDGES])],
    lambda x: tuple(_saturated(x, kind) for _, kind in _SATURATING),
)

# Inclusive scans as JAX writes them (a reduce-window as long as the axis, padded n - 1 on one
# side): lowered as ceil(log2 n) doubling steps rather than n window offsets
SCANS = Case(
    "scans",
    """HloModule scans
add {
  a = f32[] parameter(0)
  b = f32[] parameter(1)
  ROOT s = f32[] add(a, b)
}
iadd {
  a = s32[] parameter(0)
  b = s32[] parameter(1)
  ROOT s = s32[] add(a, b)
}
max {
  a = f32[] parameter(0)
  b = f32[] parameter(1)
  ROOT m = f32[] maximum(b, a)
}
imin {
  a = s32[] parameter(0)
  b = s32[] parameter(1)
  ROOT m = s32[] minimum(a, b)
}
mul {
  a = f32[] parameter(0)
  b = f32[] parameter(1)
  ROOT m = f32[] multiply(a, b)
}
ENTRY main {
  x = f32[3,1000] parameter(0)
  k = s32[77,5] parameter(1)
  zero = f32[] constant(0)
  izero = s32[] constant(0)
  ninf = f32[] constant(-inf)
  big = s32[] constant(2147483647)
  one = f32[] constant(1)
  sum = f32[3,1000] reduce-window(x, zero), window={size=1x1000 pad=0_0x999_0}, to_apply=add
  rsum = f32[3,1000] reduce-window(x, zero), window={size=1x1000 pad=0_0x0_999}, to_apply=add
  top = f32[3,1000] reduce-window(x, ninf), window={size=1x1000 pad=0_0x999_0}, to_apply=max
  isum = s32[77,5] reduce-window(k, izero), window={size=77x1 pad=76_0x0_0}, to_apply=iadd
  imin = s32[77,5] reduce-window(k, big), window={size=77x1 pad=0_76x0_0}, to_apply=imin
  prod = f32[3,1000] reduce-window(x, one), window={size=1x1000 pad=0_0x999_0}, to_apply=mul
  small = f32[2,50] parameter(2)
  offset = f32[2,50] reduce-window(small, one), window={size=1x50 pad=0_0x49_0}, to_apply=add
  ROOT out = (f32[3,1000], f32[3,1000], f32[3,1000], s32[77,5], s32[77,5], f32[3,1000], f32[2,50])
    tuple(sum, rsum, top, isum, imin, prod, offset)
}
""",
    lambda rng: [(1 + rng.standard_normal((3, 1000)) / 1000).astype(np.float32),
                 rng.integers(-1000, 1000, (77, 5)).astype(np.int32),
                 rng.standard_normal((2, 50)).astype(np.float32)],
    lambda x, k, small: (
        np.cumsum(x.astype(np.float64), axis=1), np.cumsum(x[:, ::-1].astype(np.float64), axis=1)[:, ::-1],
        np.maximum.accumulate(x, axis=1), np.cumsum(k, axis=0).astype(np.int32),
        np.minimum.accumulate(k[::-1], axis=0)[::-1], np.cumprod(x.astype(np.float64), axis=1),
        # an init of 1 is no identity of add: every padded element adds it (50 - j of them), no scan
        np.cumsum(small.astype(np.float64), axis=1) + (50 - np.arange(50))),
)

CASES = [FLOAT_UNARY, SCALAR_ERF, SIGNED_ZEROS, FLOAT_BINARY, INTEGERS, PREDICATES, INTEGER_DOT, INT8_DOTS,
         MOVEMENT, CONTROL_FLOW, ARGMAX, TEXT_FORMS, WINDOWS, DEPTHWISE, MIXED_CONVOLUTIONS, INDEXED,
         RUNTIME_WINDOWS, SCATTERS, SEGMENT_SUMS, CONSTANT_INDICES, OPT_BARRIER, SORTING, NAN_ORDER,
         JAX_SORTS, TOURNAMENT, BITS, SELECT_AND_SCATTER, ELEMENTS, KEYED_ROWS, RANDOM, SATURATING_CONVERTS,
         SCANS]


@pytest.mark.slow
@pytest.mark.parametrize("case", CASES, ids=[c.name for c in CASES])
def test_op_compiles_verifies_and_matches_numpy(tmp_path: Path, case: Case) -> None:
    model = tmp_path / f"{case.name}.hlo"
    model.write_text(case.hlo)
    neff = tmp_path / f"{case.name}.neff"
    compiled = run_ncc("compile", str(model), "--output", str(neff), "--verify", timeout=300)
    assert compiled.returncode == 0, compiled.stderr
    inputs = case.inputs(np.random.default_rng(sum(map(ord, case.name))))
    inputs_path, out_path = tmp_path / "in.npz", tmp_path / "out.npz"
    np.savez(inputs_path, **{f"arg{k}": a for k, a in enumerate(inputs)})
    ran = run_ncc("run", str(neff), "--inputs", str(inputs_path), "--output", str(out_path), timeout=300)
    assert ran.returncode == 0, ran.stderr
    with np.errstate(all="ignore"):
        expected = case.reference(*inputs)
    expected = expected if isinstance(expected, tuple) else (expected,)
    with np.load(out_path) as outputs:
        assert sorted(outputs.files, key=lambda n: int(n[3:])) == [f"out{k}" for k in range(len(expected))]
        for k, want in enumerate(expected):
            got = outputs[f"out{k}"]
            want = np.asarray(want)
            if want.dtype.kind in "biu":
                assert got.dtype == want.dtype, f"out{k}: {got.dtype} vs {want.dtype}"
                wrong = np.argwhere(got != want)
                assert not len(wrong), f"out{k}: {len(wrong)} wrong, first at {wrong[0]}"
            else:
                np.testing.assert_allclose(got, want.astype(np.float32), rtol=1e-5, atol=1e-5, equal_nan=True,
                                           err_msg=f"out{k}")


@pytest.mark.parametrize("algorithm, state, new_state, bits", RNG_EXPECTED,
                         ids=[f"{a}-{len(s)}-{_hlo_type(b)}" for a, s, _, b in RNG_EXPECTED])
def test_rng_bits_match_xla_cpu(algorithm: str, state: np.ndarray, new_state: np.ndarray,
                                bits: np.ndarray) -> None:
    """The evaluator's definition of rng-bit-generator (tools/hlo/rng_bits.py) against XLA:CPU's values."""
    code = {name: number for number, name in ALGORITHM_NAMES.items()}[algorithm]
    got_state, got_bits = rng_bit_generator(state, bits.shape, bits.dtype, code)
    assert got_bits.dtype == bits.dtype and np.array_equal(got_bits, bits)
    assert got_state.dtype == np.uint64 and np.array_equal(got_state, new_state)
    if bits.dtype == np.uint32:  # a narrower type keeps the low bits of the same 32-bit draw
        _, low = rng_bit_generator(state, bits.shape, np.uint16, code)
        assert np.array_equal(low, bits.astype(np.uint16))
    _, signed = rng_bit_generator(state, bits.shape, np.dtype(f"i{bits.dtype.itemsize}"), code)
    assert np.array_equal(signed.view(bits.dtype), bits)  # a signed type: the same bits


def test_rows_keyed_by_two_dimensions_move_as_rows(tmp_path: Path) -> None:
    """KEYED_ROWS' scatter and gathers lower to a few row nests (12 rows, set one at a time as
    repeated keys need: 36 nests), not one indirect-dma row per element (3,154 nests when each of
    the 1,560 elements was scattered on its own; the MoE cut took 574 s to compile that way)."""
    from ncc.tools.hlo.hlo_reader import load_module
    from ncc.tools.hlo2penguin.lower import lower_module

    model = tmp_path / "keyed_rows.hlo"
    model.write_text(KEYED_ROWS.hlo)
    assert len(lower_module(load_module(str(model))).nests) < 100


def test_integer_outputs_compare_exactly() -> None:
    """The off-by-one an fp32 dot makes at 16785409 fails --verify whatever the tolerance."""
    got, want = np.array([16785408, 5], dtype=np.int32), np.array([16785409, 5], dtype=np.int32)
    assert not compare("out0", got, want, atol=1e-4, rtol=1.0).ok
    assert compare("out0", want.copy(), want, atol=0.0, rtol=0.0).ok
    flags = np.array([True, False])
    assert not compare("out1", flags, ~flags, atol=10.0, rtol=10.0).ok


def test_s32_dot_is_exact_end_to_end(tmp_path: Path) -> None:
    """[[4097,0],[3,5]] @ [[4097,1],[7,11]] is 16785409 at [0,0]: fp32 gives 16785408."""
    model = tmp_path / "s32dot.hlo"
    model.write_text("""HloModule s32dot
ENTRY main {
  a = s32[2,2] constant({ {4097, 0}, {3, 5} })
  b = s32[2,2] constant({ {4097, 1}, {7, 11} })
  p = s32[2,2] parameter(0)
  ab = s32[2,2] dot(a, b), lhs_contracting_dims={1}, rhs_contracting_dims={0}
  ROOT r = s32[2,2] add(ab, p)
}
""")
    neff = tmp_path / "s32dot.neff"
    compiled = run_ncc("compile", str(model), "--output", str(neff), "--verify", timeout=120)
    assert compiled.returncode == 0, compiled.stderr
    inputs, out = tmp_path / "in.npz", tmp_path / "out.npz"
    np.savez(inputs, arg0=np.zeros((2, 2), dtype=np.int32))
    ran = run_ncc("run", str(neff), "--inputs", str(inputs), "--output", str(out), timeout=120)
    assert ran.returncode == 0, ran.stderr
    with np.load(out) as outputs:
        assert outputs["out0"].tolist() == [[16785409, 4097], [12326, 58]]


@pytest.mark.parametrize("text, code, words", [
    ("ROOT c = f32[4] custom-call(), custom_call_target=\"MyKernel\"", "E201", ["custom-call", "MyKernel"]),
    ("x = f32[4] parameter(0)\nROOT y = f32[4] popcnt(x)", "E203", ["popcnt", "y", "integer"]),
    ("x = f32[4] parameter(0)\nROOT y = f32[4] rng-bit-generator(x)", "E203", ["rng-bit-generator", "y"]),
    ("x = u64[3] parameter(0)\nROOT y = (u64[3], u32[4]) rng-bit-generator(x), algorithm=rng_three_fry",
     "E203", ["rng-bit-generator", "'y'", "u64[2]"]),
    ("x = u64[2] parameter(0)\nROOT y = (u64[2], f32[4]) rng-bit-generator(x), algorithm=rng_philox",
     "E203", ["rng-bit-generator", "'y'", "integer"]),
])
def test_refusals_name_the_instruction(tmp_path: Path, text: str, code: str, words: list[str]) -> None:
    model = tmp_path / "m.hlo"
    model.write_text(f"HloModule m\n\nENTRY main {{\n{text}\n}}\n")
    compiled = run_ncc("compile", str(model), "--output", str(tmp_path / "m.neff"), timeout=60)
    assert compiled.returncode != 0 and f"[{code}]" in compiled.stderr, compiled.stderr
    assert "Traceback" not in compiled.stderr
    assert all(word in compiled.stderr for word in words), compiled.stderr


def test_computed_loop_bound_is_refused_naming_the_loop(tmp_path: Path) -> None:
    """A while whose condition depends on computed data cannot be unrolled: E207 names it, and
    where the framework made it (its metadata: JAX's op name and the user's source line)."""
    model = tmp_path / "m.hlo"
    model.write_text("""HloModule m
body {
  s = (f32[4], s32[]) parameter(0)
  x = f32[4] get-tuple-element(s), index=0
  i = s32[] get-tuple-element(s), index=1
  y = f32[4] add(x, x)
  one = s32[] constant(1)
  j = s32[] add(i, one)
  ROOT t = (f32[4], s32[]) tuple(y, j)
}
cond {
  s = (f32[4], s32[]) parameter(0)
  x = f32[4] get-tuple-element(s), index=0
  z = f32[] constant(0)
  m = f32[] reduce(x, z), dimensions={0}, to_apply=max
  lim = f32[] constant(100)
  ROOT lt = pred[] compare(m, lim), direction=LT
}
max {
  a = f32[] parameter(0)
  b = f32[] parameter(1)
  ROOT c = f32[] maximum(a, b)
}
ENTRY main {
  x = f32[4] parameter(0)
  c = s32[] constant(0)
  init = (f32[4], s32[]) tuple(x, c)
  ROOT w = (f32[4], s32[]) while(init), condition=cond, body=body,
    metadata={op_name="jit(newton)/while" source_file="/home/me/solver.py" source_line=12}
}
""")
    compiled = run_ncc("compile", str(model), "--output", str(tmp_path / "m.neff"), timeout=60)
    assert compiled.returncode != 0, compiled.stderr
    assert "[E207]" in compiled.stderr and "'w'" in compiled.stderr, compiled.stderr
    assert "(at w, from jit(newton)/while at solver.py:12)" in compiled.stderr, compiled.stderr


def test_zero_element_iota_of_a_huge_axis_materializes_nothing(tmp_path: Path) -> None:
    """f32[10**12, 0]: the golden evaluator and the frontend never build the 10**12-long index line."""
    model = tmp_path / "m.hlo"
    model.write_text("HloModule m\n\nENTRY main {\n"
                     "  ROOT i = f32[1000000000000,0] iota(), iota_dimension=0\n}\n")
    compiled = run_ncc("compile", str(model), "--output", str(tmp_path / "m.neff"), "--verify", timeout=60)
    assert compiled.returncode == 0, compiled.stderr


def test_a_loop_past_the_trip_limit_is_refused_from_its_counter_alone() -> None:
    """A body that computes on an array: the trip count folds from the counter without lowering
    the body, so the refusal (E207) comes before any trip is unrolled: 20,000 trips are past the
    unroller's limit (--loops unrolled), 2,000,000 past a kept loop's; 20,000 trips stay one loop
    otherwise, and a loop of 3 trips of the same body still unrolls and computes."""
    from ncc.tools.common.errors import CompileError
    from ncc.tools.hlo.hlo_text import parse_hlo_text
    from ncc.tools.hlo2penguin.lower import lower_module

    def module(trips: int) -> str:
        return f"""HloModule m
body {{
  s = (f32[300,70], s32[]) parameter(0)
  x = f32[300,70] get-tuple-element(s), index=0
  i = s32[] get-tuple-element(s), index=1
  y = f32[300,70] exponential(x)
  one = s32[] constant(1)
  j = s32[] add(i, one)
  ROOT t = (f32[300,70], s32[]) tuple(y, j)
}}
cond {{
  s = (f32[300,70], s32[]) parameter(0)
  i = s32[] get-tuple-element(s), index=1
  n = s32[] constant({trips})
  ROOT lt = pred[] compare(i, n), direction=LT
}}
ENTRY main {{
  x = f32[300,70] parameter(0)
  c = s32[] constant(0)
  init = (f32[300,70], s32[]) tuple(x, c)
  ROOT w = (f32[300,70], s32[]) while(init), condition=cond, body=body
}}
"""
    for trips, loops in ((20_000, "unrolled"), (2_000_000, "auto")):
        with pytest.raises(CompileError) as info:
            lower_module(parse_hlo_text(module(trips)), loops)
        assert info.value.code == "E207" and "w" in info.value.location
    kept = lower_module(parse_hlo_text(module(20_000)))
    assert [repeat.trips for repeat in kept.repeats] == [20_000]
    assert sum(nest.source == "y" for nest in lower_module(parse_hlo_text(module(3))).nests) == 3


def test_a_counter_that_doubles_is_folded_trip_by_trip_not_extrapolated() -> None:
    """while (i < 2**30) i *= 2 runs 30 trips. Its first two trips (2, 4) looked affine, the
    extrapolation 2, 4, 6, ... never reached 2**30 within a million trips, and the loop was refused
    (E207) without the closed form ever being checked; now the check fails, and the loop is folded
    trip by trip: 30 trips, unrolled, computing what the interpreter computes."""
    from ncc.tools.hlo.hlo_text import parse_hlo_text
    from ncc.tools.hlo2penguin.lower import lower_module

    text = """HloModule m
body {
  s = (s32[], f32[4]) parameter(0)
  i = s32[] get-tuple-element(s), index=0
  two = s32[] constant(2)
  j = s32[] multiply(i, two)
  x = f32[4] get-tuple-element(s), index=1
  y = f32[4] exponential(x)
  ROOT t = (s32[], f32[4]) tuple(j, y)
}
cond {
  s = (s32[], f32[4]) parameter(0)
  i = s32[] get-tuple-element(s), index=0
  n = s32[] constant(1073741824)
  ROOT lt = pred[] compare(i, n), direction=LT
}
ENTRY main {
  one = s32[] constant(1)
  x = f32[4] parameter(0)
  init = (s32[], f32[4]) tuple(one, x)
  ROOT w = (s32[], f32[4]) while(init), condition=cond, body=body
}
"""
    for loops in ("auto", "rolled", "unrolled"):
        program = lower_module(parse_hlo_text(text), loops)
        assert sum(nest.source == "y" for nest in program.nests) == 30, loops


def test_a_jax_comparator_runs_once_per_element_not_per_comparison() -> None:
    """A float sort by a TOTALORDER compare lowers to about as many nests as an integer sort (the
    total-order keys are made once, not in every comparison), and JAX's comparator, which
    canonicalizes both sides (NaN, -0) before that compare, to not many more (was 2.1x and 3.3x)."""
    from ncc.tools.hlo.hlo_text import parse_hlo_text
    from ncc.tools.hlo2penguin.lower import lower_module

    def nests(comparator: str, dtype: str = "f32") -> int:
        text = "HloModule m\n" + JAX_LESS + f"""bare_less {{
  a = f32[] parameter(0)
  b = f32[] parameter(1)
  ROOT lt = pred[] compare(a, b), direction=LT, type=TOTALORDER
}}
int_less {{
  a = s32[] parameter(0)
  b = s32[] parameter(1)
  ROOT lt = pred[] compare(a, b), direction=LT
}}
ENTRY main {{
  x = {dtype}[8,200] parameter(0)
  ROOT s = {dtype}[8,200] sort(x), dimensions={{1}}, is_stable=true, to_apply={comparator}
}}
"""
        return len(lower_module(parse_hlo_text(text)).nests)

    integers, bare, jax = nests("int_less", "s32"), nests("bare_less"), nests("jax_less")
    assert bare <= integers + 12 and jax <= 1.25 * bare, (integers, bare, jax)


def test_top_k_of_a_vocabulary_is_lowered_not_refused() -> None:
    """k = 50 of 8 rows of 32,000 (a sampling head over a vocabulary) was refused: one bitonic
    network of 16,650 tile operations (E306). As a tournament (chunks of 256, three rounds, then a
    sort: 7,734) it lowers; a top-k no plan fits is still E306, naming it."""
    from ncc.tools.common.errors import CompileError
    from ncc.tools.hlo.hlo_text import parse_hlo_text
    from ncc.tools.hlo2penguin.lower import lower_module

    def top_k(rows: int, count: int, k: int) -> int:
        text = f"""HloModule m
ENTRY main {{
  x = f32[{rows},{count}] parameter(0)
  ROOT t = (f32[{rows},{k}], s32[{rows},{k}]) topk(x), k={k}, largest=true
}}
"""
        return len(lower_module(parse_hlo_text(text)).nests)

    assert top_k(8, 32000, 50) > 0
    with pytest.raises(CompileError) as refused:
        top_k(64, 50257, 100)
    assert refused.value.code == "E306" and "'t'" in str(refused.value)


def test_verify_on_inputs_with_nans_follows_total_order(tmp_path: Path) -> None:
    """The golden evaluator honours compare's type=TOTALORDER (NaN after +inf, -0 before +0): JAX's
    sorts and top-k checked by --verify-inputs on NaNs and signed zeros agree with the NEFF (the
    evaluator compared as IEEE does, NaN unordered with everything, and failed E610 on them)."""
    model, inputs = tmp_path / "m.hlo", tmp_path / "in.npz"
    model.write_text(JAX_SORTS.hlo.replace(
        "  ROOT out = (f32[5,37], s32[5,37]) tuple(s, ai)",
        "  t = (f32[5,4], s32[5,4]) topk(x), k=4, largest=true\n"
        "  tv = f32[5,4] get-tuple-element(t), index=0\n"
        "  ROOT out = (f32[5,37], s32[5,37], f32[5,4]) tuple(s, ai, tv)"))
    np.savez(inputs, arg0=JAX_SORTS.inputs(np.random.default_rng(3))[0])
    compiled = run_ncc("compile", str(model), "--output", str(tmp_path / "m.neff"),
                       "--verify-inputs", str(inputs), timeout=300)
    assert compiled.returncode == 0, compiled.stderr


def test_a_square_root_power_of_minus_infinity_is_plus_infinity(tmp_path: Path) -> None:
    """power(x, 0.5) is C's pow, as XLA computes it: +inf at -inf and +0 at -0. numpy's power takes
    0.5 as a square root (nan and -0 there), so --verify-inputs failed a correct NEFF with E610."""
    model, inputs, out = tmp_path / "m.hlo", tmp_path / "in.npz", tmp_path / "out.npz"
    model.write_text("HloModule m\nENTRY e {\n  x = f32[6] parameter(0)\n  c = f32[] constant(0.5)\n"
                     "  b = f32[6] broadcast(c), dimensions={}\n  ROOT p = f32[6] power(x, b)\n}\n")
    x = np.array([-np.inf, -0.0, -4.0, 0.0, np.inf, 4.0], dtype=np.float32)
    np.savez(inputs, arg0=x)
    neff = tmp_path / "m.neff"
    compiled = run_ncc("compile", str(model), "--output", str(neff), "--verify-inputs", str(inputs),
                       timeout=120)
    assert compiled.returncode == 0, compiled.stderr
    ran = run_ncc("run", str(neff), "--inputs", str(inputs), "--output", str(out), timeout=120)
    assert ran.returncode == 0, ran.stderr
    got = np.load(out)["out0"]
    np.testing.assert_array_equal(got, np.array([np.inf, 0.0, np.nan, 0.0, np.inf, 2.0], dtype=np.float32))
    assert not np.signbit(got[1])
