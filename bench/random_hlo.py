"""Random small HLO modules, the kind a fuzzer or a framework's test suite produces: the random
bench's (`make bench-random`) and the random-module tests' inputs.

`random_module(seed)` returns HLO text that ncc's verifier accepts: up to MAX_INSTRUCTIONS
instructions, ranks 1-5, sizes 1-31 (mostly odd), every element type ncc supports, no array
over MAX_ELEMENTS elements. Each module grows a pool of values from a few parameters, one
operation at a time, drawn from: elementwise arithmetic, bitwise ops and compares, select,
convert, broadcast, transpose, reshape, slice, concatenate, pad, reverse, dot (batched too),
convolution (1-3 spatial dimensions, strides, padding, lhs and rhs dilation, feature groups),
reduce (plain and variadic argmax), reduce-window, gather and scatter of rows, iota and sort;
the root is a tuple of the last values.

Values are kept comparable with the golden evaluator exactly where the compiled program must be
exact: no integer is computed from a float that was itself computed (a last-bit difference in a
float sum would flip a truncation), no float is compared after arithmetic, and no op whose
result is not finite on ordinary inputs (log, divide) is drawn.
"""

from __future__ import annotations

import math
import random
from dataclasses import dataclass, field

MAX_INSTRUCTIONS = 60     # the entry's instructions
MAX_ELEMENTS = 1 << 21    # the largest array (2M elements)
MAX_TOTAL = 1 << 23       # all the entry's arrays together, far under --verify's budget
FLOATS = ("f32", "bf16", "f16")
SIGNED = ("s8", "s16", "s32", "s64")
UNSIGNED = ("u8", "u16", "u32", "u64")
INTEGERS = SIGNED + UNSIGNED
TYPES = FLOATS + INTEGERS + ("pred",)
LOWEST = {"s8": -128, "s16": -32768, "s32": -(2 ** 31), "s64": -(2 ** 63)}
HIGHEST = {"s8": 127, "s16": 32767, "s32": 2 ** 31 - 1, "s64": 2 ** 63 - 1, "u8": 255, "u16": 65535,
           "u32": 2 ** 32 - 1, "u64": 2 ** 64 - 1}


@dataclass(frozen=True)
class Value:
    name: str
    dtype: str
    shape: tuple[int, ...]
    exact: bool  # holds no float computed by arithmetic (safe to compare or truncate)

    @property
    def text(self) -> str:
        return f"{self.dtype}[{','.join(map(str, self.shape))}]"


@dataclass
class _Module:
    rng: random.Random
    lines: list[str] = field(default_factory=list)
    regions: dict[str, str] = field(default_factory=dict)
    pool: list[Value] = field(default_factory=list)
    params: int = 0
    count: int = 0
    total: int = 0

    def emit(self, dtype: str, shape: tuple[int, ...], rhs: str, exact: bool, pool: bool = True) -> Value:
        value = Value(f"v{self.count}", dtype, tuple(shape), exact)
        self.count += 1
        self.total += math.prod(shape)
        self.lines.append(f"  {value.name} = {value.text} {rhs}")
        if pool:
            self.pool.append(value)
        return value

    def emit_tuple(self, types: str, rhs: str) -> str:
        """An instruction of tuple shape `types` (no array of its own); returns its name."""
        name = f"v{self.count}"
        self.count += 1
        self.lines.append(f"  {name} = {types} {rhs}")
        return name

    def parameter(self, dtype: str, shape: tuple[int, ...], pool: bool = True) -> Value:
        value = self.emit(dtype, shape, f"parameter({self.params})", True, pool)
        self.params += 1
        return value

    def constant(self, dtype: str, number: object) -> Value:
        return self.emit(dtype, (), f"constant({_literal(dtype, number)})", True, pool=False)

    def region(self, name: str, text: str) -> str:
        self.regions.setdefault(name, text)
        return name


def _literal(dtype: str, number: object) -> str:
    if dtype == "pred":
        return "true" if number else "false"
    if dtype in FLOATS:
        return {float("inf"): "inf", float("-inf"): "-inf"}.get(float(number), repr(float(number)))
    return str(int(number))


def random_shape(rng: random.Random, rank: int | None = None, budget: int = 1 << 14) -> tuple[int, ...]:
    """Rank 1-5, sizes 1-31 (odd three times in four), at most `budget` elements."""
    rank = rng.randint(1, 5) if rank is None else rank
    shape = []
    for _ in range(rank):
        size = rng.randrange(1, 32, 2) if rng.random() < 0.75 else rng.randint(1, 31)
        shape.append(size)
    while math.prod(shape) > budget:
        k = max(range(rank), key=lambda d: shape[d])
        shape[k] = max(1, shape[k] // 2 | 1)
    return tuple(shape)


def _reducer(m: _Module, op: str, dtype: str) -> str:
    name = f"{op}_{dtype}"
    return m.region(name, f"{name} {{\n  a = {dtype}[] parameter(0)\n  b = {dtype}[] parameter(1)\n"
                          f"  ROOT r = {dtype}[] {op}(a, b)\n}}\n")


def _argmax(m: _Module, dtype: str) -> str:
    name = f"argmax_{dtype}"
    body = (f"{name} {{\n  av = {dtype}[] parameter(0)\n  ai = s32[] parameter(1)\n"
            f"  bv = {dtype}[] parameter(2)\n  bi = s32[] parameter(3)\n"
            f"  gt = pred[] compare(av, bv), direction=GT\n"
            f"  eq = pred[] compare(av, bv), direction=EQ\n  lt = pred[] compare(ai, bi), direction=LT\n"
            f"  tie = pred[] and(eq, lt)\n  pick = pred[] or(gt, tie)\n"
            f"  v = {dtype}[] select(pick, av, bv)\n  i = s32[] select(pick, ai, bi)\n"
            f"  ROOT r = ({dtype}[], s32[]) tuple(v, i)\n}}\n")
    return m.region(name, body)


def _identity(op: str, dtype: str) -> object:
    if op in ("add", "or", "and"):
        return int(op == "and")
    if op == "multiply":
        return 1
    if dtype in FLOATS:
        return float("-inf") if op == "maximum" else float("inf")
    if op == "maximum":
        return LOWEST.get(dtype, 0)
    return HIGHEST[dtype]


def _pick(m: _Module, want=lambda v: True) -> Value | None:
    """A value of the pool (of rank 1 or more) that `want` takes, recent ones more often."""
    choices = [v for v in m.pool if v.shape and want(v)]
    if not choices:
        return None
    # recent values more often, so the module is a chain more than a fan
    return choices[min(len(choices) - 1, int(len(choices) * (1 - m.rng.random() ** 2)))]


def _partner(m: _Module, x: Value) -> Value:
    """A value of x's type and shape: one from the pool, or a new parameter."""
    other = _pick(m, lambda v: v.dtype == x.dtype and v.shape == x.shape and v is not x)
    return other if other is not None and m.rng.random() < 0.6 else m.parameter(x.dtype, x.shape)


# ---- the operations: each takes the module and returns the value it made (or None) ----------------
def _binary(m: _Module) -> Value | None:
    x = _pick(m, lambda v: v.dtype != "pred")
    if x is None:
        return None
    y = _partner(m, x)
    ops = ["add", "subtract", "multiply", "maximum", "minimum"]
    if x.dtype in INTEGERS:
        ops += ["and", "or", "xor", "shift-left", "shift-right-logical"]
    op = m.rng.choice(ops)
    exact = x.exact and y.exact and x.dtype not in FLOATS
    return m.emit(x.dtype, x.shape, f"{op}({x.name}, {y.name})", exact)


def _unary(m: _Module) -> Value | None:
    x = _pick(m)
    if x is None:
        return None
    if x.dtype == "pred":
        return m.emit("pred", x.shape, f"not({x.name})", x.exact)
    ops = ["negate", "abs"] + (["tanh", "floor", "sign"] if x.dtype in FLOATS else ["not"])
    op = m.rng.choice(ops)
    return m.emit(x.dtype, x.shape, f"{op}({x.name})", x.exact and x.dtype not in FLOATS)


def _compare(m: _Module) -> Value | None:
    x = _pick(m, lambda v: v.exact)
    if x is None:
        return None
    y = _pick(m, lambda v: v.exact and v.dtype == x.dtype and v.shape == x.shape) or x
    direction = m.rng.choice(["EQ", "NE"] if x.dtype == "pred" else ["EQ", "NE", "LT", "LE", "GT", "GE"])
    pred = m.emit("pred", x.shape, f"compare({x.name}, {y.name}), direction={direction}", True)
    if m.rng.random() < 0.7:
        a = _pick(m, lambda v: v.shape == x.shape)
        b = _partner(m, a) if a is not None else None
        if a is not None and b is not None:
            return m.emit(a.dtype, a.shape, f"select({pred.name}, {a.name}, {b.name})", a.exact and b.exact)
    return pred


def _convert(m: _Module) -> Value | None:
    x = _pick(m, lambda v: v.dtype not in FLOATS or v.exact)
    if x is None:
        return None
    target = m.rng.choice(TYPES if x.dtype not in FLOATS else FLOATS + INTEGERS)
    return m.emit(target, x.shape, f"convert({x.name})", target not in FLOATS or x.dtype not in FLOATS)


def _broadcast(m: _Module) -> Value | None:
    x = _pick(m, lambda v: len(v.shape) < 5)
    if x is None:
        return None
    extra = m.rng.randint(1, 5 - len(x.shape))
    sizes = random_shape(m.rng, extra, max(1, min(MAX_ELEMENTS, 1 << 16) // max(1, math.prod(x.shape))))
    rank = len(x.shape) + extra
    kept = sorted(m.rng.sample(range(rank), len(x.shape)))
    shape, it = [], iter(sizes)
    for d in range(rank):
        shape.append(x.shape[kept.index(d)] if d in kept else next(it))
    listed = ",".join(map(str, kept))
    return m.emit(x.dtype, tuple(shape), f"broadcast({x.name}), dimensions={{{listed}}}", x.exact)


def _transpose(m: _Module) -> Value | None:
    x = _pick(m, lambda v: len(v.shape) > 1)
    if x is None:
        return None
    perm = list(range(len(x.shape)))
    m.rng.shuffle(perm)
    return m.emit(x.dtype, tuple(x.shape[p] for p in perm),
                  f"transpose({x.name}), dimensions={{{','.join(map(str, perm))}}}", x.exact)


def _reshape(m: _Module) -> Value | None:
    x = _pick(m)
    if x is None:
        return None
    n = math.prod(x.shape)
    factors = [p for p in range(2, 32) if n % p == 0]
    shape: list[int] = []
    rest = n
    for _ in range(m.rng.randint(0, 4)):
        usable = [p for p in factors if rest % p == 0]
        if not usable:
            break
        p = m.rng.choice(usable)
        shape.append(p)
        rest //= p
    shape.append(rest)
    m.rng.shuffle(shape)
    return m.emit(x.dtype, tuple(shape), f"reshape({x.name})", x.exact)


def _slice(m: _Module) -> Value | None:
    x = _pick(m)
    if x is None:
        return None
    parts, shape = [], []
    for n in x.shape:
        start = m.rng.randint(0, n - 1) if n > 1 and m.rng.random() < 0.5 else 0
        limit = m.rng.randint(start + 1, n)
        stride = m.rng.choice([1, 1, 2, 3])
        parts.append(f"[{start}:{limit}:{stride}]")
        shape.append(-(-(limit - start) // stride))
    return m.emit(x.dtype, tuple(shape), f"slice({x.name}), slice={{{', '.join(parts)}}}", x.exact)


def _concatenate(m: _Module) -> Value | None:
    x = _pick(m)
    if x is None:
        return None
    axis = m.rng.randrange(len(x.shape))
    y = _pick(m, lambda v: v.dtype == x.dtype and len(v.shape) == len(x.shape) and all(
        a == b for d, (a, b) in enumerate(zip(v.shape, x.shape, strict=True)) if d != axis))
    y = y or x
    shape = list(x.shape)
    shape[axis] += y.shape[axis]
    if math.prod(shape) > MAX_ELEMENTS:
        return None
    return m.emit(x.dtype, tuple(shape), f"concatenate({x.name}, {y.name}), dimensions={{{axis}}}",
                  x.exact and y.exact)


def _pad(m: _Module) -> Value | None:
    x = _pick(m)
    if x is None:
        return None
    zero = m.constant(x.dtype, 0)
    config, shape = [], []
    for n in x.shape:
        low, high = m.rng.randint(-min(2, n - 1), 3), m.rng.randint(-min(2, n - 1), 3)
        interior = m.rng.choice([0, 0, 1, 2])
        size = low + high + n + max(n - 1, 0) * interior
        if size < 1:
            low, high = 0, 0
            size = n + max(n - 1, 0) * interior
        config.append(f"{low}_{high}" + (f"_{interior}" if interior else ""))
        shape.append(size)
    if math.prod(shape) > MAX_ELEMENTS:
        return None
    return m.emit(x.dtype, tuple(shape), f"pad({x.name}, {zero.name}), padding={'x'.join(config)}", x.exact)


def _reverse(m: _Module) -> Value | None:
    x = _pick(m)
    if x is None:
        return None
    dims = sorted(m.rng.sample(range(len(x.shape)), m.rng.randint(1, len(x.shape))))
    return m.emit(x.dtype, x.shape, f"reverse({x.name}), dimensions={{{','.join(map(str, dims))}}}", x.exact)


def _iota(m: _Module) -> Value | None:
    dtype = m.rng.choice(("s32", "u16", "f32", "s64", "u8"))
    shape = random_shape(m.rng)
    return m.emit(dtype, shape, f"iota(), iota_dimension={m.rng.randrange(len(shape))}", True)


def _reduce(m: _Module) -> Value | None:
    x = _pick(m, lambda v: len(v.shape) >= 1)
    if x is None:
        return None
    dims = sorted(m.rng.sample(range(len(x.shape)), m.rng.randint(1, len(x.shape))))
    kept = tuple(n for d, n in enumerate(x.shape) if d not in dims)
    listed = ",".join(map(str, dims))
    if x.dtype != "pred" and x.exact and m.rng.random() < 0.3:  # argmax: (value, index), a tie-break
        index = m.emit("s32", x.shape, f"iota(), iota_dimension={dims[-1]}", True, pool=False)
        low, zero = m.constant(x.dtype, _identity("maximum", x.dtype)), m.constant("s32", 0)
        kept_text = ",".join(map(str, kept))
        both = m.emit_tuple(f"({x.dtype}[{kept_text}], s32[{kept_text}])",
                            f"reduce({x.name}, {index.name}, {low.name}, {zero.name}), "
                            f"dimensions={{{listed}}}, to_apply={_argmax(m, x.dtype)}")
        picked = m.rng.randrange(2)
        return m.emit((x.dtype, "s32")[picked], kept, f"get-tuple-element({both}), index={picked}", True)
    ops = ["or", "and"] if x.dtype == "pred" else ["add", "maximum", "minimum", "multiply"]
    op = m.rng.choice(ops if x.dtype not in FLOATS else ops[:3])
    init = m.constant(x.dtype, _identity(op, x.dtype))
    return m.emit(x.dtype, kept, f"reduce({x.name}, {init.name}), dimensions={{{listed}}}, "
                  f"to_apply={_reducer(m, op, x.dtype)}", x.exact and (x.dtype not in FLOATS or op != "add"))


def _reduce_window(m: _Module) -> Value | None:
    x = _pick(m, lambda v: v.dtype != "pred")
    if x is None:
        return None
    sizes, strides, pads, dilations, out = [], [], [], [], []
    for n in x.shape:
        size = m.rng.randint(1, min(n, 4))
        stride = m.rng.randint(1, 3)
        low, high = m.rng.randint(0, size - 1), m.rng.randint(0, size - 1)
        base = m.rng.choice([1, 1, 2]) if n > 1 else 1
        dilated = (n - 1) * base + 1 + low + high
        count = (dilated - size) // stride + 1
        sizes.append(size)
        strides.append(stride)
        pads.append(f"{low}_{high}")
        dilations.append(base)
        out.append(count)
    op = m.rng.choice(["add", "maximum", "minimum"])
    init = m.constant(x.dtype, _identity(op, x.dtype))
    window = f"size={'x'.join(map(str, sizes))} stride={'x'.join(map(str, strides))} pad={'x'.join(pads)}"
    if any(d > 1 for d in dilations):
        window += f" lhs_dilate={'x'.join(map(str, dilations))}"
    return m.emit(x.dtype, tuple(out), f"reduce-window({x.name}, {init.name}), window={{{window}}}, "
                  f"to_apply={_reducer(m, op, x.dtype)}", x.exact and (x.dtype not in FLOATS or op != "add"))


def _dot(m: _Module) -> Value | None:
    dtype = m.rng.choice(("f32", "bf16", "s32", "u8", "s8", "f16", "u32"))
    batch = m.rng.randint(1, 3) if m.rng.random() < 0.3 else 0
    mm, k, n = (m.rng.randint(1, 31) for _ in range(3))
    if m.rng.random() < 0.2:
        k = m.rng.randint(100, 300)
    lead = (batch,) if batch else ()
    lhs, rhs = m.parameter(dtype, (*lead, mm, k)), m.parameter(dtype, (*lead, k, n))
    b = "lhs_batch_dims={0}, rhs_batch_dims={0}, " if batch else ""
    c = 1 + bool(batch)
    return m.emit(dtype, (*lead, mm, n), f"dot({lhs.name}, {rhs.name}), {b}lhs_contracting_dims={{{c}}}, "
                  f"rhs_contracting_dims={{{c - 1}}}", dtype not in FLOATS)


def _convolution(m: _Module) -> Value | None:
    dtype = m.rng.choice(("f32", "bf16", "s32", "u8", "s16", "f16"))
    spatial = m.rng.randint(1, 3)
    groups = m.rng.choice([1, 1, 2, 3])
    batch = m.rng.randint(1, 3)
    in_features, out_features = groups * m.rng.randint(1, 4), groups * m.rng.randint(1, 3)
    sizes, kernel, out, parts = [], [], [], {"stride": [], "pad": [], "lhs_dilate": [], "rhs_dilate": []}
    for _ in range(spatial):
        n, w = m.rng.randint(1, 15), m.rng.randint(1, 4)
        stride, lhs_d, rhs_d = m.rng.randint(1, 2), m.rng.choice([1, 1, 2]), m.rng.choice([1, 1, 2])
        low, high = m.rng.randint(0, 2), m.rng.randint(0, 2)
        base = (n - 1) * lhs_d + 1 + low + high
        span = (w - 1) * rhs_d + 1
        if base < span:
            return None
        sizes.append(n)
        kernel.append(w)
        out.append((base - span) // stride + 1)
        for key, value in (("stride", stride), ("pad", f"{low}_{high}"), ("lhs_dilate", lhs_d),
                           ("rhs_dilate", rhs_d)):
            parts[key].append(str(value))
    letters = "".join(str(d) for d in range(spatial))
    lhs = m.parameter(dtype, (batch, *sizes, in_features))
    rhs = m.parameter(dtype, (*kernel, in_features // groups, out_features))
    window = f"size={'x'.join(map(str, kernel))} " + " ".join(f"{k}={'x'.join(v)}" for k, v in parts.items())
    group = f", feature_group_count={groups}" if groups > 1 else ""
    return m.emit(dtype, (batch, *out, out_features), f"convolution({lhs.name}, {rhs.name}), "
                  f"window={{{window}}}, dim_labels=b{letters}f_{letters}io->b{letters}f{group}",
                  dtype not in FLOATS)


def _gather(m: _Module) -> Value | None:
    x = _pick(m, lambda v: len(v.shape) >= 1)
    if x is None:
        return None
    rows = m.rng.randint(1, 31)
    indices = m.parameter("s32", (rows, 1), pool=False)
    rest = x.shape[1:]
    offset = ",".join(str(d + 1) for d in range(len(rest)))
    sizes = ",".join(map(str, (1, *rest)))
    return m.emit(x.dtype, (rows, *rest), f"gather({x.name}, {indices.name}), offset_dims={{{offset}}}, "
                  f"collapsed_slice_dims={{0}}, start_index_map={{0}}, index_vector_dim=1, "
                  f"slice_sizes={{{sizes}}}", x.exact)


def _scatter(m: _Module) -> Value | None:
    x = _pick(m, lambda v: len(v.shape) >= 1 and v.dtype != "pred")
    if x is None:
        return None
    rows = m.rng.randint(1, 31)
    indices = m.parameter("s32", (rows, 1), pool=False)
    updates = m.parameter(x.dtype, (rows, *x.shape[1:]), pool=False)
    window = ",".join(str(d + 1) for d in range(len(x.shape) - 1))
    op = m.rng.choice(["add", "maximum", "assign"])
    if op == "assign":
        combine = m.region(f"assign_{x.dtype}", f"assign_{x.dtype} {{\n  a = {x.dtype}[] parameter(0)\n"
                                                f"  ROOT b = {x.dtype}[] parameter(1)\n}}\n")
    else:
        combine = _reducer(m, op, x.dtype)
    return m.emit(x.dtype, x.shape, f"scatter({x.name}, {indices.name}, {updates.name}), "
                  f"update_window_dims={{{window}}}, inserted_window_dims={{0}}, "
                  f"scatter_dims_to_operand_dims={{0}}, index_vector_dim=1, to_apply={combine}",
                  x.exact and (x.dtype not in FLOATS or op != "add"))


def _sort(m: _Module) -> Value | None:
    x = _pick(m, lambda v: v.exact and v.dtype != "pred" and math.prod(v.shape) <= 1 << 12)
    if x is None:
        return None
    dim = m.rng.randrange(len(x.shape))
    direction = m.rng.choice(["LT", "GT"])
    name = f"less_{x.dtype}_{direction}"
    name = m.region(name, f"{name} {{\n  a = {x.dtype}[] parameter(0)\n  b = {x.dtype}[] parameter(1)\n"
                          f"  ROOT r = pred[] compare(a, b), direction={direction}\n}}\n")
    return m.emit(x.dtype, x.shape, f"sort({x.name}), dimensions={{{dim}}}, to_apply={name}", x.exact)


OPERATIONS = (  # (weight, operation)
    (10, _binary), (5, _unary), (5, _compare), (4, _convert), (4, _broadcast), (4, _transpose),
    (3, _reshape), (4, _slice), (3, _concatenate), (3, _pad), (3, _reverse), (2, _iota), (6, _reduce),
    (4, _reduce_window), (3, _dot), (4, _convolution), (3, _gather), (3, _scatter), (1, _sort),
)


def random_module(seed: int, max_instructions: int = MAX_INSTRUCTIONS) -> str:
    """A random module (HLO text) from `seed`: the same seed gives the same module."""
    m = _Module(random.Random(seed))
    for _ in range(m.rng.randint(1, 3)):
        m.parameter(m.rng.choice(TYPES), random_shape(m.rng))
    weights = [w for w, _ in OPERATIONS]
    target = m.rng.randint(4, max_instructions - 4)
    for _ in range(50 * max_instructions):
        if m.count >= target:
            break
        before = (len(m.lines), m.count, m.params, m.total, len(m.pool))
        _, operation = m.rng.choices(OPERATIONS, weights)[0]
        made = operation(m)
        if made is None or m.count > max_instructions - 1 or m.total > MAX_TOTAL or \
                any(math.prod(v.shape) > MAX_ELEMENTS for v in m.pool[before[4]:]):
            lines, m.count, m.params, m.total, pool = before
            del m.lines[lines:]
            del m.pool[pool:]
    outputs = m.pool[-m.rng.randint(1, min(3, len(m.pool))):]
    root = f"({', '.join(v.text for v in outputs)}) tuple({', '.join(v.name for v in outputs)})"
    body = "\n".join(m.lines)
    return (f"HloModule random_{seed}\n\n" + "\n".join(m.regions.values()) +
            f"\nENTRY main {{\n{body}\n  ROOT out = {root}\n}}\n")
