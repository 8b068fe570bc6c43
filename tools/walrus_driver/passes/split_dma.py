"""Split large DMAs by partition ranges so that several DMA queues move one tile together.

A dma moves its bytes on one queue (target.dma_queue_bandwidth_gbps, ~27 GB/s), and a core has 16
queues: one 128-partition x 4 KiB tile load holds one queue for ~20 us while the engine that needs
it idles. This pass cuts a dma whose on-chip side spans P partitions into up to `max_parts` dmas
over consecutive partition ranges, each moving at least `min_bytes`, so that assign_hwdge_engine
(which hands a trigger engine's dmas to its queues round-robin) spreads the pieces over queues.

A dma is split only when its HBM side's outermost dimension walks the on-chip partitions (the
form the frontend writes: partition p of the tile is HBM row p); then a piece over partitions
[a, b) reads HBM rows [a, b): the same dims with offset + a * stride and count b - a. An
HBM-to-HBM dma (a direct copy) whose two sides walk the same rows first is cut in rows the same
way, on both sides. An on-chip
partition broadcast (one partition read P times, stride 0, into P partitions: how the frontend
spreads a row it loaded once) is split the same way, each piece filling partitions [a, b). The pieces
keep the original's trigger engine and place in the order. It adds instructions, so it runs before
anti_dependency_analyzer and assign_hwdge_engine.

Pieces cost as well: each holds its queue for the fixed DMA latency (~0.5 us) and is one more
instruction for every later pass. Splitting pays where a transfer's latency is exposed, at the
start of a program and in programs with few transfers; in a program of thousands of tile DMAs the
16 queues are kept busy by different transfers anyway. So the dmas, in program order (with loops:
the ones run most first), get their pieces until the program holds `max_extra` pieces more than
it had dmas, and later ones stay whole. The D = 8192 MLP (38,528 tile dmas, each cut in 8) went
from 352,640 backend instructions, its queues busy as long as its PE (48-53 ms of 58 ms, 9 ms of
it fixed latency), to 123,904.

In a program without loops a piece also has to fit in the queues' slack: the fixed latency of
the extra pieces may not take the queues' work past the busiest engine's, since a program whose
queues are its bound only gets slower by them; the first `free_extra` pieces are always cut (the
start of any program is latency-bound). The LLaMA decode step (3,830 transfers of weights read
once, its queues' work 1.8x its PE's) went from 1,456 to 1,321 us with its 128 KiB weight tiles
whole. The rule holds only the loads of inputs and the stores of outputs: a value the program
stores to HBM and reads back waits for both transfers on its way from producer to reader, so
those are always cut (a CLIP text encoder, 48 MB of such round trips, ran 638 us with them whole
and 375 us cut; a diffusion ResBlock 393 and 247 us; the decode step 1,275 and 1,208 us).

A program that keeps loops is left to the size rule: its loops keep only their rotating buffers'
transfers in flight, so all 16 queues are busy only where the pieces make them (the LLaMA prefill
and GPT-2 were 57 % and 63 % slower with their in-loop dmas whole), the slack estimate, which
assumes they can be, does not hold there (GPT-2 lost 3 % with its dmas outside loops whole).
"""

from __future__ import annotations

from collections import Counter
from dataclasses import dataclass

from ncc.schemas import bir_pb2, common_pb2
from ncc.tools.common.dtypes import itemsize
from ncc.tools.target import (
    DMA_SPLIT_FREE_EXTRA,
    DMA_SPLIT_MAX_EXTRA,
    DMA_SPLIT_MAX_PARTS,
    DMA_SPLIT_MIN_BYTES,
    dma_pieces,
)
from ncc.tools.walrus_driver.analysis import birutil
from ncc.tools.walrus_driver.analysis.costs import SYNC_ONLY
from ncc.tools.walrus_driver.context import PassContext
from ncc.tools.walrus_driver.registry import register

NAME = "split_dma"


@dataclass
class Options:
    max_parts: int = DMA_SPLIT_MAX_PARTS  # pieces per dma at most
    min_bytes: int = DMA_SPLIT_MIN_BYTES  # bytes each piece moves at least (smaller ones are latency-bound)
    max_extra: int = DMA_SPLIT_MAX_EXTRA  # pieces beyond one per dma in the whole program (0: no limit)
    free_extra: int = DMA_SPLIT_FREE_EXTRA  # pieces outside loops cut whatever the slack (-1: no slack rule)
    fit_first_wave: bool = True  # re-cut the loads ready at the start to fill the queues once


@register(NAME, Options)
def run(ctx: PassContext) -> None:
    options: Options = ctx.options or Options()
    ctx.forbid_after_sync()
    if ctx.queues_assigned:
        ctx.fail_needs_before("assign_hwdge_engine")
    program = ctx.program
    instructions = list(program.instructions)
    ids = [instr.id for instr in instructions]  # read once: each read of a field is a lookup
    parts = {node: _parts(instr, options) for node, instr in zip(ids, instructions, strict=True)}
    kept_whole = 0
    if options.max_extra > 0:
        kept_whole = _limit_extra(_most_run_first(ctx, ids), parts, options.max_extra)
    if options.free_extra >= 0 and not ctx.loop_entries:
        kept_whole += _limit_to_slack(ctx, parts, options.free_extra)
    rebalanced = _fit_first_wave(program, parts, ctx.target.dma_queues if options.fit_first_wave else 0)
    next_id = max(ids, default=-1) + 1
    result: list[bir_pb2.Instruction] = []
    split = 0
    for node, instr in zip(ids, instructions, strict=True):
        ranges = _ranges(instr, parts[node])
        if len(ranges) < 2:
            result.append(instr)
            continue
        split += 1
        pieces = [instr]  # the first piece is the original, narrowed in place (it keeps its id)
        for _ in ranges[1:]:
            piece = bir_pb2.Instruction()
            piece.CopyFrom(instr)
            piece.id = next_id
            next_id += 1
            pieces.append(piece)
        name = instr.name
        for part, (piece, (first, last)) in enumerate(zip(pieces, ranges, strict=True)):
            piece.name = f"{name}/part{part}"
            for ap in [*piece.inputs, *piece.outputs]:
                _narrow(ap, first, last)
        result += pieces
    if split:
        birutil.set_order(program, result)
        ctx.instructions_changed()
    ctx.set_stat("dmas_split", split)
    ctx.set_stat("first_wave_rebalanced", rebalanced)
    ctx.set_stat("kept_whole", kept_whole)
    ctx.set_stat("instructions", len(program.instructions))


def _most_run_first(ctx: PassContext, ids: list[int]) -> list[int]:
    """The dmas in the order they get their pieces: in a program with loops, the ones run most
    first (the product of their loops' trips), in program order among equals. The limit bounds
    static instructions, and a piece pays once per run: by program order GPT-2's budget ran out
    before its last nest, the LM head, whose weight tiles (194 runs each) then moved whole on two
    queues while PE waited (8 ms for 3.5 ms of matmuls)."""
    if not ctx.loop_entries:
        return ids
    nest = ctx.loops()
    runs = {node: nest.runs(node) for node in ids}
    return sorted(ids, key=lambda node: -runs[node])  # stable: program order among equals


def _limit_extra(ids: list[int], parts: dict[int, int], max_extra: int) -> int:
    """Cut the dmas in the order of `ids` until `max_extra` extra pieces are spent (the last may get
    fewer pieces than the size rule allows); later ones stay whole. Returns how many the limit kept
    whole or cut less. (penguin_budget.backend_instruction_count counts the same way.)"""
    spare, limited = max_extra, 0
    for node in ids:
        extra = parts[node] - 1
        if extra <= 0:
            continue
        if extra > spare:
            parts[node] = 1 + spare
            limited += 1
        spare -= parts[node] - 1
    return limited


def _limit_to_slack(ctx: PassContext, parts: dict[int, int], free_extra: int) -> int:
    """Cut the loads of inputs and the stores of outputs of a program without loops, in program
    order, only while the fixed latency of their extra pieces fits in the queues' slack (module
    docstring): the busiest engine's work times the queues, less the queues' work with every dma
    whole, over the fixed latency, is how many extra pieces the queues can take before they become
    the bound (at least `free_extra`). The dmas of values that go through HBM are always cut: each
    stands between the instruction that computed the value and the one that reads it back, on the
    program's critical path, where a whole dma takes `max_parts` times as long. Returns how many
    dmas this kept whole or cut less."""
    target, table = ctx.target, ctx.costs()
    engine_ns: Counter[int] = Counter()
    queue_ns = 0.0
    for instr in ctx.program.instructions:
        if instr.op not in SYNC_ONLY:
            cost = table(instr)
            engine_ns[instr.engine] += cost.engine_ns
            queue_ns += cost.transfer_ns
    busiest = max(engine_ns.values(), default=0.0)
    round_trips = _round_trips(ctx.program)
    slack = (busiest * target.dma_queues - queue_ns) / target.dma_fixed_latency_ns
    limited = [instr.id for instr in ctx.program.instructions if not _through_hbm(instr, round_trips)]
    return _limit_extra(limited, parts, max(free_extra, int(slack)))


def _round_trips(program: bir_pb2.Program) -> set[str]:
    """The HBM tensors the program both writes and reads (by any transfer, an indirect one's
    too): values that go through HBM."""
    written: set[str] = set()
    read: set[str] = set()
    for instr in program.instructions:
        read.update(ap.tensor for ap in instr.inputs if ap.memory == common_pb2.HBM)
        written.update(ap.tensor for ap in instr.outputs if ap.memory == common_pb2.HBM)
    return written & read


def _through_hbm(instr: bir_pb2.Instruction, round_trips: set[str]) -> bool:
    """Whether a dma stores or loads a value that goes through HBM (`_round_trips`)."""
    return instr.op == "dma" and any(
        ap.memory == common_pb2.HBM and ap.tensor in round_trips for ap in [*instr.inputs, *instr.outputs]
    )


def _fit_first_wave(program: bir_pb2.Program, parts: dict[int, int], queues: int) -> int:
    """Re-cut the loads that are ready at the start so that their pieces fill the queues once.

    A load of a tensor that no instruction writes (a kernel input or constant) depends on nothing,
    so all of them are ready together. When they are no more than the queues but their pieces
    are, and the last round would leave most queues idle (the matmul: 2 x (64 KiB + 256 KiB)
    makes 20 pieces for 16 queues; 4 wait for a second round while 12 queues idle), each load
    gets a share of the queues in proportion to its bytes (at least 1, at most what the size rule
    allows), so that they end together. Only when they all feed one result (the matmul's
    accumulation): when the last round is fuller, or the loads feed several results, cutting
    coarser delays the first consumer (measured: layernorm 28.2 -> 29.2 us, the two-layer mlp
    25.5 -> 26.5 us), so the wave stays as the size rule cut it.
    Returns how many loads were re-cut (0 when `queues` is 0 or the wave already fits).
    """
    if queues <= 0:
        return 0
    hbm = common_pb2.HBM
    unwritten = {t.name for t in program.hbm if t.role in (bir_pb2.INPUT, bir_pb2.CONSTANT)}
    wave = [
        instr
        for instr in program.instructions
        if parts[instr.id] > 1 and instr.inputs[0].memory == hbm and instr.inputs[0].tensor in unwritten
    ]
    pieces = sum(parts[instr.id] for instr in wave)
    if not wave or len(wave) > queues or pieces <= queues or pieces % queues > queues // 2:
        return 0  # it fits, or cannot be made to, or its last round keeps most queues busy anyway
    if len(_results_of(program, {instr.outputs[0].tensor for instr in wave})) != 1:
        return 0  # the loads feed different results: the first ones needed should come first
    sizes = [birutil.operand_bytes(instr.outputs[0]) for instr in wave]
    total = sum(sizes)
    limits = [parts[instr.id] for instr in wave]
    shares = [max(1, min(limit, queues * size // total)) for limit, size in zip(limits, sizes, strict=True)]
    # Hand out what rounding down left, largest remainder first, within each load's own limit.
    order = sorted(range(len(wave)), key=lambda k: -(queues * sizes[k] % total))
    spare = queues - sum(shares)
    for k in order:
        if spare <= 0:
            break
        if shares[k] < limits[k]:
            shares[k] += 1
            spare -= 1
    for instr, share in zip(wave, shares, strict=True):
        parts[instr.id] = share
    return len(wave)


def _results_of(program: bir_pb2.Program, buffers: set[str]) -> set[str]:
    """What the instructions reading `buffers` write (stops once there are two)."""
    results: set[str] = set()
    for instr in program.instructions:
        if any(ap.tensor in buffers and ap.memory != common_pb2.HBM for ap in instr.inputs):
            results.update(out.tensor for out in instr.outputs)
            if len(results) > 1:
                break
    return results


def _ranges(instr: bir_pb2.Instruction, parts: int) -> list[tuple[int, int]]:
    """Consecutive partition ranges cutting `instr` into `parts` pieces ([] when it stays whole)."""
    if parts < 2:
        return []
    if _hbm_to_hbm(instr):
        partitions = instr.inputs[0].dims[0].count
    else:
        onchip = instr.outputs[0] if instr.outputs[0].memory != common_pb2.HBM else instr.inputs[0]
        partitions = onchip.partition_count
    bounds = [partitions * k // parts for k in range(parts + 1)]
    return list(zip(bounds[:-1], bounds[1:], strict=True))


def _parts(instr: bir_pb2.Instruction, options: Options) -> int:
    """How many pieces the size rule cuts `instr` into (1: it stays whole)."""
    if instr.op != "dma" or len(instr.inputs) != 1 or len(instr.outputs) != 1:
        return 1
    if _hbm_to_hbm(instr):  # both sides walk the same rows first: pieces of rows, as a tile's
        rows, total = instr.inputs[0].dims[0].count, birutil.operand_bytes(instr.inputs[0])
        return dma_pieces(rows, total, options.max_parts, options.min_bytes)
    if _on_chip_broadcast(instr):  # its one-partition source's dims[0] walks the partitions
        source, onchip = instr.inputs[0], instr.outputs[0]
    else:
        sides = {ap.memory == common_pb2.HBM: ap for ap in (instr.inputs[0], instr.outputs[0])}
        if set(sides) != {True, False}:
            return 1  # on chip to on chip, or HBM to HBM of different rows: no walk to split along
        source, onchip = sides[True], sides[False]
    partitions, free = onchip.partition_count, _free(onchip)
    if not source.dims or source.dims[0].count != partitions or _free(source) != partitions * free:
        return 1
    total = partitions * free * itemsize(onchip.dtype)
    return dma_pieces(partitions, total, options.max_parts, options.min_bytes)


def _hbm_to_hbm(instr: bir_pb2.Instruction) -> bool:
    """An HBM-to-HBM dma (hlo_opt's direct copies) whose two sides walk the same number of rows
    first, each row the same number of elements: a piece over rows [a, b) is one on both sides."""
    src, out = instr.inputs[0], instr.outputs[0]
    if src.memory != common_pb2.HBM or out.memory != common_pb2.HBM or not src.dims or not out.dims:
        return False
    rows = src.dims[0].count
    return rows > 1 and out.dims[0].count == rows and _free(src) == _free(out)


def _on_chip_broadcast(instr: bir_pb2.Instruction) -> bool:
    """An on-chip dma that copies one partition (read with stride 0) to every partition of its output."""
    src, out = instr.inputs[0], instr.outputs[0]
    return (src.memory != common_pb2.HBM and out.memory != common_pb2.HBM and src.partition_count == 1
            and len(src.dims) > 1 and src.dims[0].stride == 0 and src.dims[0].count == out.partition_count)


def _free(ap: bir_pb2.AccessPattern) -> int:
    free = 1
    for dim in ap.dims:
        free *= dim.count
    return free


def _narrow(ap: bir_pb2.AccessPattern, first: int, last: int) -> None:
    """Restrict an operand to partitions (rows, on the HBM side; repeats, on a broadcast's
    one-partition source) [first, last)."""
    if ap.memory == common_pb2.HBM or (ap.partition_count == 1 and ap.dims and ap.dims[0].stride == 0):
        ap.offset += first * ap.dims[0].stride
        ap.dims[0].count = last - first
    else:
        ap.partition_start += first
        ap.partition_count = last - first
