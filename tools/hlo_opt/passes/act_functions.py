"""Instruction selection for ACT: statements that compute one of the ACT engine's built-in functions
of one tile, step by elementwise step, become one activation of that function.

Frameworks write such functions out. jax.nn.gelu(approximate=True) is nine statements, seven on
DVE (x² = x·x; x³ = x²·x; q = x³·0.044715; s = x + q; m = s·√(2/π); t = tanh(m); u = t + 1;
h = u·0.5; y = x·h), which is ACT's `gelu_apprx_tanh` (NKI `nl.gelu_apprx_tanh`); the exact gelu
(jax.nn.gelu(approximate=False), PyTorch's default) reaches XLA as x·½·erfc(−x/√2) and its erfc as
a rational approximation of two branches and selects: some 60 statements, 45 on DVE, for what is
ACT's `gelu` (NKI `nl.gelu`). BERT's layer spent 1,026 of its 1,854 µs in that nest.

A chain is found by what it computes, not by its shape. Within one nest, the *cone* of a tensor x
is every statement, in order, whose inputs are x or what earlier statements of the cone wrote:
elementwise statements (tensor_tensor, tensor_scalar, activation, select, a float32 copy, a
constant's fill), each the only writer of its output, all on x's tile under the same predicates,
with x not written in between. Each statement of the cone computes a function of x alone, so
evaluating the cone on a fixed sample of float32 values (SAMPLES: a dense grid over [−12, 12],
powers of ten up to 1e30 with both signs, zeros, and NaN and both infinities last) gives that
function's values, with the simulator's own ALU semantics (tools/common/alu.py). A statement
whose value takes at least MIN_STATEMENTS of the cone's, and whose output the cone does not
consume alone (another statement or nest reads it), is compared with every function of ACT's
table on the same sample: where one agrees everywhere (NaN where it is NaN, zeros of the same
sign, within TOLERANCE elsewhere), the statement becomes that activation of x, and the statements
it no longer needs are left for `dce`, which runs after this pass.

Exactness. `gelu_apprx_tanh` is the nine float32 operations in jax's order, so that chain gives
the same bits either way. Others agree within TOLERANCE relative, or ABS_FLOOR where the function
is below it in magnitude: the erfc approximation XLA writes is within 6.3e-6 (53 ulp) of the exact
gelu where that is above 1e-20, and ACT's `gelu` is the exact one rounded once. At the non-finite
inputs a function must agree too, NaN included (so `where(isnan(y), 0, y)`, which is y at every
finite input, is not the identity), with one allowance: at ±inf the chain may give NaN where the
function gives its limit, since a written-out formula overflows there (jax's gelu gives NaN at −inf,
−inf · erfc(inf) = −inf · 0, and ACT's −0).
Every tensor of a cone is float32 but a comparison's output (0 or 1 in any type): a bf16 chain
rounds after every step, which no ACT function does.
Cones whose statements are the same operations (a model's layers) are evaluated once, and a cone
of more than MAX_STATEMENTS statements is not searched (so a long fused chain costs its length).
"""

from __future__ import annotations

import functools
from collections import Counter
from dataclasses import dataclass, field
from itertools import chain

import numpy as np

from ncc.schemas import common_pb2, penguin_pb2
from ncc.tools.common import alu
from ncc.tools.hlo_opt.passes import ELEMENTWISE_OPS, fills_one_value

MIN_STATEMENTS = 3  # a cone this long at least: a shorter one saves little, and ACT is not free
# A cone longer than this is not searched: the exact gelu is some 60 statements, while a fused
# chain of N elementwise ops makes each tensor's cone the rest of the chain, so searching them
# all cost O(N^2) (the scale family's chain of 12,500: its Frontend ran past 10 minutes and 4.6 GB).
MAX_STATEMENTS = 256
TOLERANCE = 1e-5  # relative, with ABS_FLOOR: within 84 ulp of float32
ABS_FLOOR = 1e-20
COMPARISONS = frozenset({"eq", "ne", "lt", "le", "gt", "ge"})


def _samples() -> np.ndarray:
    powers = 10.0 ** np.arange(-30, 31, 1, dtype=np.float64)
    special = np.array([0.0, -0.0], dtype=np.float64)
    finite = np.concatenate([np.linspace(-12.0, 12.0, 24_001), powers, -powers, special])
    return np.concatenate([finite, NON_FINITE]).astype(np.float32)


NON_FINITE = np.array([np.nan, np.inf, -np.inf])  # the last samples
SAMPLES = _samples()
_FINITE = slice(0, len(SAMPLES) - len(NON_FINITE))


@dataclass
class ActFunctionStats:
    activations: int = 0  # statements replaced by one activation
    functions: Counter = field(default_factory=Counter)  # of those, per ACT function


def select_act_functions(program: penguin_pb2.Program) -> ActFunctionStats:
    """Replace each cone statement that computes an ACT function of one tile by that activation."""
    stats = ActFunctionStats()
    f32 = {t.name for t in program.tensors if t.dtype == common_pb2.F32}
    readers = Counter(a.tensor for nest in program.nests for st in nest.statements for a in st.inputs)
    # A cone's operations up to a statement, numbered as a trie: (the number of those up to the
    # statement before, or -1; this statement's operation) -> a number. A key is then found in
    # constant time at each statement, not by hashing the whole prefix (a fused chain's cones are
    # 256 statements long, and there are hundreds of them).
    prefixes: dict[tuple[int, tuple], int] = {}
    found: dict[int, str | None] = {}  # the number of a cone's operations up to a statement -> the function
    for nest in program.nests:
        changed: set[int] = set()
        for x, cone in _cones(nest, f32):
            if changed.intersection(cone):
                continue  # a statement of it reads x now: its cone is not what was found
            structure = _structure(nest, x, cone)
            inside = Counter(a.tensor for k in cone for a in nest.statements[k].inputs)
            values: list[np.ndarray] | None = None
            replace: list[tuple[int, str]] = []
            sizes = _closure_sizes(structure)
            key = -1
            for position in range(len(cone)):
                key = prefixes.setdefault((key, structure[position]), len(prefixes))
                st = nest.statements[cone[position]]
                out = st.outputs[0].tensor
                if sizes[position] < MIN_STATEMENTS or readers[out] == inside[out]:
                    continue  # too short; or only the cone reads it: a later statement is the one to replace
                if key not in found:
                    values = values if values is not None else _evaluate(structure)
                    found[key] = _matching_function(values[position])
                func = found[key]
                if func is not None and structure[position] != ("activation", func, (1.0, 0.0), False, (-1,)):
                    replace.append((cone[position], func))
            x_access = next(a for k in cone for a in nest.statements[k].inputs if a.tensor == x)
            for k, func in replace:
                _become_activation(nest.statements[k], func, x_access)
                changed.add(k)
                stats.activations += 1
                stats.functions[func] += 1
    return stats


def _cones(nest: penguin_pb2.LoopNest, f32: set[str]) -> list[tuple[str, list[int]]]:
    """(x, the statement indices of x's cone) for every tensor x whose cone is MIN_STATEMENTS long.

    Two things keep this linear in a long fused chain, where every tensor's cone is the rest of the
    chain: a scan stops past the last statement that could still join (one reading a value of the
    cone, or a constant), and tensors are taken last reader first, so that a cone which takes in
    the first statement of a cone already found too long is too long itself (that cone is a part of
    it: each of its statements reads only what the larger cone has, on the same tile, while x is
    not written) and is dropped without being walked."""
    statements = nest.statements
    writers: dict[str, list[int]] = {}
    for k, st in enumerate(statements):
        for access in st.outputs:
            writers.setdefault(access.tensor, []).append(k)
    # per eligible statement: (its tile and predicates, its inputs, its output)
    eligible: dict[int, tuple[bytes, set[str], str]] = {}
    for k, st in enumerate(statements):
        if not _elementwise(st, f32) or writers[st.outputs[0].tensor] != [k]:
            continue
        tiles = {_tile_key(a) for a in (*st.inputs, *st.outputs)}
        if len(tiles) == 1:
            where = tiles.pop() + b"".join(p.SerializeToString(deterministic=True) for p in st.predicates)
            eligible[k] = (where, {a.tensor for a in st.inputs}, st.outputs[0].tensor)
    # x's cone starts at its first reader, but for the constants (input-less fills) before it
    first_reader: dict[str, int] = {}
    last_reader: dict[str, int] = {}
    for k in eligible:
        for a in statements[k].inputs:
            first_reader.setdefault(a.tensor, k)
            last_reader[a.tensor] = k
    constants = [k for k, (_, inputs, _) in eligible.items() if not inputs]
    constant_set = set(constants)
    last_constant = constants[-1] if constants else -1
    # x -> (the cone's tile, the index of the statement past which it was too long)
    too_long: dict[str, tuple[bytes, int]] = {}
    found: dict[str, list[int]] = {}
    for x, start in sorted(first_reader.items(), key=lambda item: -item[1]):
        if x not in f32:
            continue

        def breaks_at(first: int, last: int, x: str = x, start: int = start) -> bool:
            """Whether x is written after the cone's first statement `first`, at or before `last`."""
            return any(w <= last and (w > first if first >= start or w >= start else
                                      first < w and w in constant_set) for w in writers.get(x, ()))

        cone: list[int] = []
        values = {x}
        where = None
        horizon = last_reader[x]
        for k in chain((c for c in constants if c < start), range(start, len(statements))):
            if k > horizon and k > last_constant:
                break  # nothing past here reads a value of the cone, and it is no constant
            if cone and k in writers.get(x, ()):
                break  # x changes: what follows is a function of another x
            if k not in eligible or not eligible[k][1] <= values:
                continue
            if where is None:
                where = eligible[k][0]
            if eligible[k][0] == where:
                cone.append(k)
                y = eligible[k][2]
                values.add(y)
                horizon = max(horizon, last_reader.get(y, -1))
                inner = too_long.get(y)
                if (inner is not None and y != x and inner[0] == where and first_reader[y] > k
                        and not breaks_at(cone[0], inner[1])):
                    too_long[x] = (where, inner[1])
                    break
                if len(cone) > MAX_STATEMENTS:
                    too_long[x] = (where, k)
                    break
        reads_x = any(x in eligible[k][1] for k in cone)  # not only constants that follow x's reader
        if x not in too_long and MIN_STATEMENTS <= len(cone) and reads_x:
            found[x] = cone
    return [(x, found[x]) for x in first_reader if x in found]


def _elementwise(st: penguin_pb2.Statement, f32: set[str]) -> bool:
    """An elementwise statement of one output this pass can evaluate: float32 throughout, but a
    comparison's output (0 or 1 in any type) and a select's condition."""
    if st.op == "iota":  # a constant is a function of x too
        return fills_one_value(st) and st.outputs[0].tensor in f32
    if st.op not in ELEMENTWISE_OPS or len(st.outputs) != 1 or not st.inputs:
        return False
    if st.op == "activation" and st.func not in alu.ACT_FUNCTIONS:
        return False
    if st.op in ("tensor_tensor", "tensor_scalar") and st.func not in alu.FLOAT_FUNCS:
        return False
    if st.op == "tensor_scalar" and not st.scalars:
        return False
    checked = [*st.inputs[1:]] if st.op == "select" else [*st.inputs]
    if not (st.op in ("tensor_tensor", "tensor_scalar") and st.func in COMPARISONS):
        checked.append(st.outputs[0])
    return all(a.tensor in f32 for a in checked)


def _structure(nest: penguin_pb2.LoopNest, x: str, cone: list[int]) -> tuple:
    """The cone's operations, each with its inputs as -1 (x) or the position of the statement of
    the cone that wrote them: equal for the same function of x whatever the tensors are named."""
    position = {nest.statements[k].outputs[0].tensor: p for p, k in enumerate(cone)}
    steps = []
    for k in cone:
        st = nest.statements[k]
        operands = tuple(-1 if a.tensor == x else position[a.tensor] for a in st.inputs)
        steps.append((st.op, st.func, tuple(np.float32(s).item() for s in st.scalars),
                      st.attributes.get("reverse") == "1", operands))
    return tuple(steps)


def _closure_sizes(structure: tuple) -> list[int]:
    """Per cone statement, how many statements of the cone its value depends on (itself included)."""
    closures: list[set[int]] = []
    for position, (*_, operands) in enumerate(structure):
        closures.append({position}.union(*(closures[p] for p in operands if p >= 0)))
    return [len(c) for c in closures]


def _evaluate(structure: tuple) -> list[np.ndarray]:
    """Each cone statement's values at x = SAMPLES, as the simulator computes them."""
    values: list[np.ndarray] = []
    with np.errstate(all="ignore"):
        for op, func, scalars, reverse, operands in structure:
            ins = [SAMPLES if p < 0 else values[p] for p in operands]
            if op == "activation":
                scale = np.float32(scalars[0]) if scalars else np.float32(1)
                bias = np.float32(scalars[1]) if len(scalars) > 1 else np.float32(0)
                result = alu.ACT_FUNCTIONS[func](ins[0] * scale + bias)
            elif op == "iota":
                result = np.full_like(SAMPLES, scalars[0] if scalars else 0.0)
            elif op == "tensor_copy":
                result = ins[0]
            elif op == "select":
                result = np.where(ins[0] != 0, ins[1], ins[2])
            else:
                a, b = (ins[0], ins[1]) if op == "tensor_tensor" else (ins[0], np.float32(scalars[0]))
                if reverse:
                    a, b = b, a
                result = alu.binary(func, a, b, np.float32, common_pb2.F32)
            values.append(np.asarray(result, dtype=np.float32))
    return values


_EXPECTED: dict[str, np.ndarray] = {}  # each ACT function at SAMPLES, computed when first asked
# A few samples spread over SAMPLES, tried first, for every function at once: a function that
# disagrees anywhere there is out without the whole comparison (most are: a long fused chain asks
# about hundreds of cones, and there are two dozen functions).
_PROBE = np.linspace(0, _FINITE.stop - 1, 257).astype(np.int64)


def _expected(func: str) -> np.ndarray:
    if func not in _EXPECTED:
        with np.errstate(all="ignore"):
            _EXPECTED[func] = np.asarray(alu.ACT_FUNCTIONS[func](SAMPLES), dtype=np.float32)
    return _EXPECTED[func]


@functools.cache
def _probed() -> tuple[list[str], np.ndarray]:
    """ACT's function names, and [functions, probes]: each function at SAMPLES[_PROBE]."""
    names = list(alu.ACT_FUNCTIONS)
    return names, np.stack([_expected(func)[_PROBE] for func in names])


def _matching_function(values: np.ndarray) -> str | None:
    """The ACT function that agrees with `values` at SAMPLES within TOLERANCE, if one does."""
    names, probed = _probed()
    with np.errstate(all="ignore"):
        for row in np.flatnonzero(_may_agree(values[_PROBE], probed)):
            func = names[row]
            expected = _expected(func)
            if _agrees(values[_FINITE], expected[_FINITE]) \
                    and _agrees_beyond(values[_FINITE.stop:], expected[_FINITE.stop:]):
                return func
    return None


def _may_agree(values: np.ndarray, expected: np.ndarray) -> np.ndarray:
    """Per row of `expected` [functions, samples]: whether `values` passes `_agrees`'s tests but
    the sign of zeros (which the full comparison makes), all rows in one go."""
    nan = np.isnan(expected)
    infinite = np.isinf(expected)
    error = np.abs(values.astype(np.float64) - expected)
    close = error <= TOLERANCE * np.abs(expected.astype(np.float64)) + ABS_FLOOR  # False at NaN or inf
    same = np.where(nan, np.isnan(values), np.where(infinite, values == expected, close))
    return same.all(axis=1)


def _agrees_beyond(values: np.ndarray, expected: np.ndarray) -> bool:
    """At NaN, +inf and -inf: NaN where `expected` is NaN and the same value elsewhere, or, at
    an infinity, NaN where `expected` is a number (the formula overflowed where ACT gives the limit)."""
    for position, (value, limit) in enumerate(zip(values, expected, strict=True)):
        overflowed = position > 0 and np.isnan(value)
        if not (overflowed or _agrees(value[None], limit[None])):
            return False
    return True


def _agrees(values: np.ndarray, expected: np.ndarray) -> bool:
    """NaN where `expected` is NaN, the same infinities, zeros of the same sign, and within
    TOLERANCE (or ABS_FLOOR) elsewhere."""
    nan = np.isnan(expected)
    if not np.array_equal(nan, np.isnan(values)):
        return False
    infinite = np.isinf(expected)
    if not np.array_equal(expected[infinite], values[infinite]) or np.isinf(values[~infinite]).any():
        return False
    finite = ~nan & ~infinite
    error = np.abs(values[finite].astype(np.float64) - expected[finite])
    if not np.all(error <= TOLERANCE * np.abs(expected[finite]) + ABS_FLOOR):
        return False
    zero = finite & ((expected == 0) | (values == 0))
    return bool(np.array_equal(np.signbit(expected[zero]), np.signbit(values[zero])))  # -0 is not +0


def _become_activation(st: penguin_pb2.Statement, func: str, x_access: penguin_pb2.Access) -> None:
    st.op, st.engine, st.func = "activation", common_pb2.ACT, func
    del st.inputs[:]
    st.inputs.append(x_access)
    del st.scalars[:]
    st.scalars.extend(alu.IDENTITY_SCALE_BIAS)  # scale, bias
    st.attributes.pop("reverse", None)


def _tile_key(access: penguin_pb2.Access) -> bytes:
    key = penguin_pb2.Access()
    key.starts.extend(access.starts)
    key.extents.extend(access.extents)
    return key.SerializeToString(deterministic=True)
