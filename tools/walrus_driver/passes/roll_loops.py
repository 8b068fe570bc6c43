"""Roll each engine stream's repeated runs back into loops, with rotating addresses and waits.

After codegen each engine's stream is the instructions the engine executes, with the loops the
Frontend kept (`--loops rolled|auto`; codegen.py) around their bodies. A loop nest the Frontend
unrolled, and a straight run inside a kept loop's body (the chain's body: two iterations of
thousands of ops that repeat every three), show there as a run of instructions repeating with a
period: the same operations on the same tensors, whose HBM offsets advance by a fixed step,
whose on-chip addresses cycle over the N buffers the allocator gave the iterations (address
rotation: AddressRotation's rotating SBUF/PSUM addresses), and whose semaphore thresholds grow by
what one iteration adds to each semaphore (the rotation waits: iteration i + N's writer of a
buffer waits for iteration i's reader through a threshold that grows with i). This pass finds
such runs and writes each as a `loop` entry and one body (docs/ir.md, Loops), innermost loops
first, then loops of loops up to MAX_LOOP_DEPTH, so a nest's stream shrinks to about its static
size. A kept loop stays as codegen wrote it; inside its body the runs roll the same way, each
instruction keeping the kept loops' variations outermost, and the kept loops count towards
MAX_LOOP_DEPTH.

A run is rolled only when every instance is reproduced exactly: each instruction's fields other
than its offsets and thresholds (op, engine, queue, function, scalars, dtypes, shapes, strides,
partitions, HBM tensor, semaphores, updates, attributes) are equal from period to period, and
each offset and threshold follows base + rotation[r % N] + (r / N) * step for some N ≤
MAX_ROTATION (thresholds: N = 1). So the executed program (tools/common/loops.py expands it) is
exactly the stream codegen wrote, instance for instance, with names `name@iteration`: what the
verifier checked before codegen is what runs, and the simulator's race and deadlock detectors see
every iteration. Inside a loop an on-chip operand names its memory as a whole (`@SBUF`, `@PSUM`:
buffers at address 0 spanning the memory) at its absolute address, since the per-iteration
virtual buffers do not survive rolling; the packager then drops buffers no stream names.

Search: from each stream position, the candidate periods are the distances to the next few
entries of the same shape; a candidate's run is extended in numpy chunks, and its offsets are
checked on a prefix first, so a position costs little when nothing repeats there and a rolled
run costs about its length. The largest coverage wins (the shorter period on a tie).

Options:
`min_trip` (2) the fewest iterations worth a loop, `max_period` (512) the longest body searched,
`max_depth` (MAX_LOOP_DEPTH) levels of nesting. Counters: static_instructions (stream entries,
loops included), dynamic_instructions (executed), loops (kept ones included), loop_depth.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np

from ncc.schemas import bir_pb2
from ncc.tools.common.loops import LOOP_OP, MAX_LOOP_DEPTH, MAX_ROTATION
from ncc.tools.target import wait_words
from ncc.tools.walrus_driver.analysis import birutil
from ncc.tools.walrus_driver.context import PassContext
from ncc.tools.walrus_driver.registry import register

NAME = "roll_loops"
WHOLE_MEMORY = birutil.WHOLE_MEMORY
_CANDIDATES = 12  # candidate periods tried from one position
_CHUNK = 1024  # entries compared at once when extending a run
_PREFIX_REPS = 16  # iterations whose offsets are checked before the whole run is
_SCALAR_STEPS = 8  # entries of a candidate run compared in Python before numpy takes over


@dataclass
class Options:
    min_trip: int = 2
    max_period: int = 512
    max_depth: int = MAX_LOOP_DEPTH


# ---- the items a stream is made of ------------------------------------------------------------


@dataclass
class _Leaf:
    """One instruction of the stream (the first instance of it, inside loops)."""

    index: int  # in the stream codegen wrote
    key: int
    ints: np.ndarray  # operand offsets (on chip: absolute addresses), then wait thresholds
    affine_only: np.ndarray  # per int: True for thresholds (no rotation)
    # per int: (step, rotation) for each enclosing loop, outermost first
    variations: list[list[tuple[int, tuple[int, ...]]]] = field(default_factory=list)

    def leaves(self) -> list[_Leaf]:
        return [self]


@dataclass
class _Loop:
    trip: int
    body: list[_Leaf | _Loop]
    key: int
    ints: np.ndarray
    affine_only: np.ndarray

    def leaves(self) -> list[_Leaf]:
        return [leaf for item in self.body for leaf in item.leaves()]


@dataclass
class _Kept:
    """A loop the stream already had (the frontend's): kept as it is, its body rolled inside it.
    Its key is its own, so no run of items holds it."""

    index: int  # its `loop` entry in the stream codegen wrote
    trip: int
    key: int
    body: list[_Leaf | _Loop | _Kept]
    ints: np.ndarray = field(default_factory=lambda: np.zeros(0, np.int64))
    affine_only: np.ndarray = field(default_factory=lambda: np.zeros(0, bool))

    def leaves(self) -> list[_Leaf]:
        return []


_Item = _Leaf | _Loop | _Kept


class _Keys:
    """Interns shapes (serialized instructions, loop signatures) as small ints (equal shapes,
    equal ids)."""

    def __init__(self) -> None:
        self.ids: dict[bytes | tuple, int] = {}

    def __call__(self, shape: bytes | tuple) -> int:
        return self.ids.setdefault(shape, len(self.ids))


def _leaf(index: int, instr: bir_pb2.Instruction, addresses: dict[str, int], keys: _Keys) -> _Leaf:
    """The instruction's ints, and its shape: the instruction serialized without them and without
    its name, id and source (an on-chip operand also without its buffer, whose address is in its
    int), so equal shapes mean instructions that differ in their ints alone."""
    shape = bir_pb2.Instruction()
    shape.CopyFrom(instr)
    shape.id, shape.name, shape.source = 0, "", ""
    shape.ClearField("in_loop")
    ints: list[int] = []
    for ap in (*shape.outputs, *shape.inputs):
        if ap.memory in WHOLE_MEMORY:
            ints.append(addresses.get(ap.tensor, 0) + ap.offset)
            ap.tensor = ""
        else:
            ints.append(ap.offset)
        ap.offset = 0
    for wait in shape.waits:
        ints.append(wait.value)
        wait.value = 0
        if wait.HasField("value_lo"):  # present or not is part of the shape; the words are the int's
            wait.value_lo = wait.value_hi = 0
    affine = np.zeros(len(ints), dtype=bool)
    affine[len(ints) - len(instr.waits):] = True
    key = keys(shape.SerializeToString(deterministic=True))
    return _Leaf(index, key, np.array(ints, dtype=np.int64), affine)


def _items(
    instructions, start: int, end: int, addresses: dict[str, int], keys: _Keys
) -> list[_Item]:
    """Entries [start, end) of a stream as items: its loops as `_Kept`, with their bodies."""
    items: list[_Item] = []
    index = start
    while index < end:
        instr = instructions[index]
        if instr.op == LOOP_OP:
            body_end = index + 1 + int(instr.body_length)
            body = _items(instructions, index + 1, body_end, addresses, keys)
            items.append(_Kept(index, int(instr.trip_count), keys(("kept", index)), body))
            index = body_end
        else:
            items.append(_leaf(index, instr, addresses, keys))
            index += 1
    return items


# ---- finding repeated runs --------------------------------------------------------------------


def _run_reps(keys: np.ndarray, key_list: list[int], i: int, period: int, most: int | None = None) -> int:
    """How many times the `period` entries from i repeat, by shape (at most `most` times). The
    first entries are compared one by one (most candidates differ there), then in numpy chunks."""
    n = len(keys) if most is None else min(len(keys), i + most * period)
    t = i
    for t in range(i, min(i + _SCALAR_STEPS, n - period)):
        if key_list[t] != key_list[t + period]:
            return 1 + (t - i) // period
    else:
        t = max(i, min(i + _SCALAR_STEPS, n - period))
    while t + period < n:
        hi = min(n - period, t + _CHUNK)
        differ = np.flatnonzero(keys[t:hi] != keys[t + period : hi + period])
        if len(differ):
            t += int(differ[0])
            break
        t = hi
    return 1 + (t - i) // period


def _consistent_reps(matrix: np.ndarray, affine_only: np.ndarray) -> int:
    """The most leading rows of `matrix` (iterations × ints) that every column reproduces as
    base + rotation[r % N] + (r / N) * step (N ≤ MAX_ROTATION; N = 1 where `affine_only`)."""
    reps = matrix.shape[0]
    best_rows = np.ones(matrix.shape[1], dtype=np.int64)
    for n in range(1, min(MAX_ROTATION, reps // 2) + 1):
        if n > 1 and bool(np.all(best_rows == reps)):
            break
        deltas = matrix[n:] - matrix[:-n]
        bad = deltas != deltas[0]
        first_bad = np.where(bad.any(axis=0), bad.argmax(axis=0), len(deltas))
        rows = first_bad + n
        if n > 1:
            rows = np.where(affine_only | (rows < 2 * n), 1, rows)
        best_rows = np.maximum(rows, best_rows)
    return int(best_rows.min()) if matrix.shape[1] else reps


def _variation(column: np.ndarray) -> tuple[int, tuple[int, ...]]:
    """(step, rotation) of the shortest rotation that reproduces `column` (one int over the
    iterations of a run `_consistent_reps` accepted, so one of at most MAX_ROTATION exists)."""
    reps = len(column)
    for n in range(1, MAX_ROTATION + 1):
        if reps <= n:
            break
        deltas = column[n:] - column[:-n]
        if bool(np.all(deltas == deltas[0])):
            step = int(deltas[0])
            return (step, ()) if n == 1 else (step, tuple(int(v - column[0]) for v in column[:n]))
    if reps == 1:
        return 0, ()
    return 0, tuple(int(v - column[0]) for v in column)  # as many iterations as the rotation


def _replay(column0: int, variation: tuple[int, tuple[int, ...]], reps: int) -> np.ndarray:
    """The values `variation` gives over `reps` iterations from base `column0` (loops.variation_value)."""
    step, rotation = variation
    r = np.arange(reps, dtype=np.int64)
    if rotation:
        n = len(rotation)
        return column0 + np.array(rotation, dtype=np.int64)[r % n] + (r // n) * step
    return column0 + r * step


class _Roller:
    def __init__(self, options: Options, keys: _Keys) -> None:
        self.options = options
        self.intern = keys

    def roll(self, items: list[_Item]) -> list[_Item]:
        """One level: runs of `items` become loops of them."""
        n = len(items)
        if n < 2 * self.options.min_trip:
            return items
        keys = np.array([item.key for item in items], dtype=np.int64)
        widths = np.array([len(item.ints) for item in items], dtype=np.int64)
        starts = np.concatenate(([0], np.cumsum(widths)))
        flat = np.concatenate([item.ints for item in items]) if starts[-1] else np.zeros(0, np.int64)
        affine = np.concatenate([item.affine_only for item in items]) if starts[-1] else np.zeros(0, bool)
        following = self._next_same(keys)
        key_list = keys.tolist()
        out: list[_Item] = []
        i = 0
        while i < n:
            best = self._best_run(keys, key_list, following, starts, flat, affine, i)
            if best is None:
                out.append(items[i])
                i += 1
                continue
            period, reps = best
            out.append(self._make_loop(items[i : i + period], reps, starts, flat, i, period))
            i += period * reps
        return out

    @staticmethod
    def _next_same(keys: np.ndarray) -> np.ndarray:
        following = np.full(len(keys), -1, dtype=np.int64)
        last: dict[int, int] = {}
        for position in range(len(keys) - 1, -1, -1):
            key = int(keys[position])
            following[position] = last.get(key, -1)
            last[key] = position
        return following

    def _best_run(self, keys, key_list, following, starts, flat, affine, i):
        options = self.options
        best = None
        best_cover = 0
        j = int(following[i])
        tried = 0
        while j != -1 and j - i <= options.max_period and tried < _CANDIDATES:
            period = j - i
            tried += 1
            j = int(following[j])
            # a prefix first, shapes then offsets: a position where nothing repeats costs
            # O(_PREFIX_REPS * period), and only a run whose prefix holds is followed to its end
            counted = _run_reps(keys, key_list, i, period, most=_PREFIX_REPS)
            if counted < options.min_trip:
                continue
            width = int(starts[i + period] - starts[i])
            lo = int(starts[i])
            matrix = flat[lo : lo + counted * width].reshape(counted, width)
            good = _consistent_reps(matrix, affine[lo : lo + width])
            if good == counted == _PREFIX_REPS:
                reps = _run_reps(keys, key_list, i, period)
                matrix = flat[lo : lo + reps * width].reshape(reps, width)
                good = _consistent_reps(matrix, affine[lo : lo + width])
            if good < options.min_trip or period * (good - 1) <= 1 or period * good <= best_cover:
                continue
            best, best_cover = (period, good), period * good
        return best

    def _make_loop(self, body, reps, starts, flat, i, period) -> _Loop:
        width = int(starts[i + period] - starts[i])
        lo = int(starts[i])
        matrix = flat[lo : lo + reps * width].reshape(reps, width)
        column = 0
        for leaf in (leaf for item in body for leaf in item.leaves()):
            for k in range(len(leaf.ints)):
                variation = _variation(matrix[:, column])
                if not np.array_equal(_replay(int(matrix[0, column]), variation, reps), matrix[:, column]):
                    raise AssertionError(f"roll_loops: iteration values not reproduced: {matrix[:, column]}")
                _prepend(leaf, k, variation)
                column += 1
        signature = (
            "loop", reps, tuple(item.key for item in body),
            tuple(tuple(map(tuple, leaf.variations)) for item in body for leaf in item.leaves()),
        )
        ints = np.concatenate([item.ints for item in body]) if width else np.zeros(0, np.int64)
        affine = np.concatenate([item.affine_only for item in body]) if width else np.zeros(0, bool)
        return _Loop(reps, list(body), self.intern(signature), ints, affine)


def _executed(items: list[_Item]) -> int:
    """Instructions `items` execute (before rolling: a leaf once, a kept loop its body trip times)."""
    return sum(item.trip * _executed(item.body) if isinstance(item, _Kept) else 1 for item in items)


def _roll_levels(roller: _Roller, items: list[_Item], levels: int, kept_depth: int = 0) -> list[_Item]:
    """`items` rolled up to `levels` levels deep, and the body of each kept loop among them rolled
    within the levels left below it (MAX_LOOP_DEPTH counts both kinds of loop)."""
    for _ in range(min(levels, MAX_LOOP_DEPTH - kept_depth)):
        rolled = roller.roll(items)
        if len(rolled) == len(items):
            break
        items = rolled
    for item in items:
        if isinstance(item, _Kept):
            item.body = _roll_levels(roller, item.body, levels, kept_depth + 1)
    return items


def _prepend(leaf: _Leaf, k: int, variation: tuple[int, tuple[int, ...]]) -> None:
    while len(leaf.variations) < len(leaf.ints):
        leaf.variations.append([])
    leaf.variations[k].insert(0, variation)


# ---- writing the rolled stream ----------------------------------------------------------------


class _Writer:
    """Flattens the rolled items of one stream into its entries (docs/ir.md, Loops)."""

    def __init__(self, stream: bir_pb2.Stream, original: list[bir_pb2.Instruction]) -> None:
        self.stream = stream
        self.original = original
        self.loops = 0
        self.depth = 0
        self.onchip_used: set[int] = set()

    def write(self, items: list[_Item], depth: int = 0, kept_depth: int = 0) -> int:
        """Append `items` inside `kept_depth` kept loops and `depth` rolled ones; the number of
        entries appended."""
        written = 0
        for item in items:
            if isinstance(item, _Kept):
                header = self.stream.instructions.add()
                header.CopyFrom(self.original[item.index])
                self.loops += 1
                self.depth = max(self.depth, kept_depth + 1)
                header.body_length = self.write(item.body, 0, kept_depth + 1)
                written += 1 + header.body_length
            elif isinstance(item, _Loop):
                header = self.stream.instructions.add(
                    op=LOOP_OP, engine=self.stream.engine, name=f"loop{self.loops}", trip_count=item.trip
                )
                self.loops += 1
                self.depth = max(self.depth, kept_depth + depth + 1)
                header.body_length = self.write(item.body, depth + 1, kept_depth)
                written += 1 + header.body_length
            elif depth == 0:
                self.stream.instructions.append(self.original[item.index])
                written += 1
            else:
                self._body_instruction(item, depth, kept_depth)
                written += 1
        return written

    def _body_instruction(self, leaf: _Leaf, depth: int, kept_depth: int) -> None:
        """`leaf` inside `depth` rolled loops within `kept_depth` kept ones: the kept loops'
        variations (outermost) stay as codegen wrote them, the rolled loops' follow."""
        instr = self.stream.instructions.add()
        instr.CopyFrom(self.original[leaf.index])
        variations = leaf.variations or [[] for _ in leaf.ints]
        k = 0
        for ap in (*instr.outputs, *instr.inputs):
            if ap.memory in WHOLE_MEMORY:
                ap.tensor = WHOLE_MEMORY[ap.memory]
                self.onchip_used.add(ap.memory)
            ap.offset = int(leaf.ints[k])
            kept = [(v.step, tuple(v.rotation)) for v in ap.loop] or [(0, ())] * kept_depth
            _set_variations(ap.loop, kept + variations[k], kept_depth + depth)
            k += 1
        for wait in instr.waits:
            wait.value = int(leaf.ints[k])
            kept_steps = list(wait.loop_steps) or [0] * kept_depth
            del wait.loop_steps[:]
            levels = variations[k]
            if any(rotation for _, rotation in levels):
                raise AssertionError(f"roll_loops: a rotating wait threshold in {instr.name}")
            steps = kept_steps + [step for step, _ in levels]
            if any(steps):
                wait.loop_steps.extend(steps)
            if wait.HasField("value_lo"):  # the words encode the first iteration's (lower_sync)
                first = max(0, wait.value) if wait.loop_steps else wait.value
                wait.value_lo, wait.value_hi = wait_words(first)
            k += 1


def _set_variations(target, levels: list[tuple[int, tuple[int, ...]]], depth: int) -> None:
    del target[:]
    if len(levels) != depth:
        raise AssertionError(f"roll_loops: {len(levels)} variations at depth {depth}")
    if any(step or rotation for step, rotation in levels):
        for step, rotation in levels:
            target.add(step=step, rotation=rotation)


@register(NAME, Options)
def run(ctx: PassContext) -> None:
    if not ctx.codegen_done:
        ctx.fail_needs_before("codegen (it rolls the per-engine streams codegen writes)")
    options: Options = ctx.options or Options()
    program = ctx.program
    addresses = {b.name: b.address for b in program.buffers}
    keys = _Keys()
    roller = _Roller(options, keys)
    static = dynamic = loops = depth = 0
    used: set[int] = set()
    for stream in program.streams:
        original = list(stream.instructions)
        items = _items(original, 0, len(original), addresses, keys)
        executed = _executed(items)
        items = _roll_levels(roller, items, options.max_depth)
        del stream.instructions[:]
        writer = _Writer(stream, original)
        writer.write(items)
        static += len(stream.instructions)
        dynamic += executed
        loops += writer.loops
        depth = max(depth, writer.depth)
        used |= writer.onchip_used
    birutil.add_whole_memories(program, ctx.target, used)
    ctx.set_stat("static_instructions", static)
    ctx.set_stat("dynamic_instructions", dynamic)
    ctx.set_stat("loops", loops)
    ctx.set_stat("loop_depth", depth)


