"""The synchronization model of docs/ir.md as vector clocks, shared by alloc_semaphores and birverifier.

Threads. Every engine stream is a thread; a dma's data moves on a second thread, its DMA queue.
Transfers of one queue run in FIFO order of issue, but dmas issued by different engines onto one
queue interleave in an order fixed only at run time, so the thread of a transfer is the pair
(queue, trigger engine): within it, issue order = the trigger engine's program order = transfer
order = completion order. That is what makes "semaphore count >= k" mean "the first k producers of
that thread have completed".

Happens-before. An instruction on engine E starts after the previous instruction of E ended
(for a dma: after its issue, not its transfer) and after the producers its waits name completed.
A dma's transfer starts after its issue and after the previous transfer of its queue thread.

Clocks. A vector clock maps each thread to the position (0-based, in that thread's order) of the
last of its instructions known to have completed, -1 for none. The clock at an instruction's access
(`access_clock`: its start, or for a dma the start of its transfer) says which accesses of other
threads are ordered before it: a dependence P -> C is covered iff
access_clock(C)[thread(P)] >= position(P).
"""

from __future__ import annotations

import array
from collections.abc import Iterable

import numpy as np

from ncc.schemas import bir_pb2
from ncc.tools.target import is_dma
from ncc.tools.target.costs import SBUF_PORT
from ncc.tools.walrus_driver.analysis import birutil

Thread = tuple[str, int, int]  # ("E", engine, 0) or ("Q", queue, trigger engine)
Clock = np.ndarray  # int32 per thread of a ClockSpace: the last position known complete, -1 none


def engine_thread(engine: int) -> Thread:
    return ("E", engine, 0)


def access_thread(instr: bir_pb2.Instruction) -> Thread:
    """The thread whose completion is the instruction's completion (and whose semaphore it bumps)."""
    if is_dma(instr.op):
        return ("Q", instr.dma_queue, instr.engine)
    return engine_thread(instr.engine)


def thread_name(thread: Thread) -> str:
    if thread[0] == "Q":
        return f"queue{thread[1]}({birutil.engine_name(thread[2])})"
    return birutil.engine_name(thread[1])


class ClockSpace:
    """Indexes threads so that clocks are plain lists of ints."""

    def __init__(self, threads: Iterable[Thread]):
        self.threads: list[Thread] = sorted(set(threads))
        self.index = {thread: position for position, thread in enumerate(self.threads)}

    @classmethod
    def for_instructions(cls, instructions: Iterable[bir_pb2.Instruction]) -> ClockSpace:
        engines: set[int] = set(birutil.ALL_ENGINES)
        queues: set[Thread] = set()
        for instr in instructions:  # access_thread, with each field read once
            engine = instr.engine
            engines.add(engine)
            if is_dma(instr.op):
                queues.add(("Q", instr.dma_queue, engine))
        return cls({engine_thread(e) for e in engines} | queues)

    def zero(self) -> Clock:
        return np.full(len(self.threads), -1, dtype=np.int32)


def join_into(a: Clock, b: Clock) -> None:
    np.maximum(a, b, out=a)


class _ByInstruction:
    """Read-only per-instruction view of a ClockWalk's columns, indexed by instruction id."""

    def __init__(self, walk: ClockWalk, read) -> None:
        self._walk, self._read = walk, read

    def __getitem__(self, instr_id: int):
        return self._read(self._walk.rows[instr_id])

    def __contains__(self, instr_id: int) -> bool:
        return instr_id in self._walk.rows


class ClockWalk:
    """Advances the clocks of every thread over instructions taken in a legal execution order.

    `step(instr, wait_clocks)` takes the clocks of the producers the instruction's waits make it
    wait for, and records its position and completion clock. Read them by instruction id:
    `position`, `thread_index`, `completion_clock` and `access_clock`. The access clock differs
    from the completion clock only in the instruction's own thread (position - 1: nothing knows
    an instruction's future), so only completion clocks are stored, as rows of one growing int32
    array: at a million instructions, per-instruction arrays and dicts cost gigabytes.
    """

    def __init__(self, space: ClockSpace):
        self.space = space
        self.engine_clock: dict[int, Clock] = {}
        self.queue_clock: dict[Thread, Clock] = {}
        self.next_position: dict[Thread, int] = {}
        # Read-only for passes' hot loops: the row of each instruction id, and per row the
        # position in its access thread and that thread's index.
        self.rows: dict[int, int] = {}
        self._clocks = np.empty((1024, len(space.threads)), dtype=np.int32)
        self.positions = array.array("q")
        self.threads = array.array("i")
        self.position = _ByInstruction(self, self.positions.__getitem__)
        self.thread_index = _ByInstruction(self, self.threads.__getitem__)
        self.completion_clock = _ByInstruction(self, self._clocks_row)
        self.access_clock = _ByInstruction(self, self._access_row)

    def _clocks_row(self, row: int) -> Clock:
        return self._clocks[row]

    def _access_row(self, row: int) -> Clock:
        clock = self._clocks[row].copy()
        clock[self.threads[row]] = self.positions[row] - 1
        return clock

    def _record(self, instr_id: int, thread: int, position: int, completion: Clock) -> None:
        row = len(self.positions)
        if row == len(self._clocks):
            grown = np.empty((2 * row, self._clocks.shape[1]), dtype=np.int32)
            grown[:row] = self._clocks
            self._clocks = grown
        self._clocks[row] = completion
        self.positions.append(position)
        self.threads.append(thread)
        self.rows[instr_id] = row

    def _engine_clock(self, engine: int) -> Clock:
        clock = self.engine_clock.get(engine)
        return self.space.zero() if clock is None else clock.copy()

    def base_clock(self, instr: bir_pb2.Instruction) -> Clock:
        """What the instruction's access is ordered after without any wait of its own."""
        clock = self._engine_clock(instr.engine)
        if is_dma(instr.op):
            queue = self.queue_clock.get(access_thread(instr))
            if queue is not None:
                join_into(clock, queue)
        return clock

    def covered(self, clock: Clock, producer: int) -> bool:
        """Whether `clock` knows instruction `producer` (by id) completed."""
        row = self.rows[producer]
        return clock[self.threads[row]] >= self.positions[row]

    def completion_covers(self, first: int, producer: int) -> bool:
        """Whether instruction `first`'s completion is ordered after `producer`'s (by ids)."""
        row = self.rows[producer]
        return self._clocks[self.rows[first], self.threads[row]] >= self.positions[row]

    def access_covers(self, consumer: int, producer: int) -> bool:
        """Whether instruction `consumer`'s access is ordered after `producer`'s completion."""
        row, mine = self.rows[producer], self.rows[consumer]
        thread = self.threads[row]
        if thread == self.threads[mine]:
            return self.positions[mine] > self.positions[row]
        return self._clocks[mine, thread] >= self.positions[row]

    def step(self, instr: bir_pb2.Instruction, wait_clocks: Iterable[Clock]) -> None:
        start = self._engine_clock(instr.engine)
        for clock in wait_clocks:
            join_into(start, clock)
        engine = engine_thread(instr.engine)
        engine_position = self.next_position.get(engine, 0)
        self.next_position[engine] = engine_position + 1
        engine_index = self.space.index[engine]
        start[engine_index] = engine_position  # now: after its issue
        self.engine_clock[instr.engine] = start
        if not is_dma(instr.op):
            self._record(instr.id, engine_index, engine_position, start)
            return
        queue = access_thread(instr)
        queue_position = self.next_position.get(queue, 0)
        self.next_position[queue] = queue_position + 1
        done = start.copy()
        previous = self.queue_clock.get(queue)
        if previous is not None:
            join_into(done, previous)
        queue_index = self.space.index[queue]
        done[queue_index] = queue_position
        self.queue_clock[queue] = done
        self._record(instr.id, queue_index, queue_position, done)


# DVE and POOL share the SBUF port, which is claimed when an instruction is dispatched, before its
# waits are checked (tools/target/costs.py): each engine's partner for that port.
PORT_PARTNER = {birutil.DVE: birutil.POOL, birutil.POOL: birutil.DVE}


def both_port_partners(program: bir_pb2.Program) -> bool:
    """Whether the program runs instructions on both DVE and POOL (else no port wait can deadlock)."""
    engines = {instr.engine for instr in program.instructions}
    return all(engine in engines for engine in PORT_PARTNER)


def waits_holding_port(instr: bir_pb2.Instruction, ports: tuple[str, ...]) -> bool:
    """Whether `instr` (holding `ports` while it runs) waits while holding the DVE/POOL SBUF port."""
    return bool(instr.waits) and instr.engine in PORT_PARTNER and SBUF_PORT in ports


def needs_partner_at_dispatch(walk: ClockWalk, instr: bir_pb2.Instruction, producer_clock: Clock,
                              base: Clock) -> bool:
    """Whether a producer whose completion clock is `producer_clock`, awaited by `instr` (a DVE or
    POOL instruction holding the SBUF port, not yet stepped; `base` is walk.base_clock(instr),
    computed once for all its waits), may still need work of the port partner that is not known
    complete when `instr` is dispatched: its clock names a later instruction of the partner than
    the clock of `instr`'s engine does. Held at dispatch, the port would then be needed by work
    that `instr` waits for: a deadlock (sync_dve_pool)."""
    partner = walk.space.index[engine_thread(PORT_PARTNER[instr.engine])]
    return bool(producer_clock[partner] > base[partner])


class SemaphoreProducers:
    """Which instruction brings each semaphore to each count, fed instructions in program order.
    alloc_semaphores gives each semaphore one thread and +1 updates, so counts follow the order."""

    def __init__(self) -> None:
        self.by_count: dict[tuple[int, int], int] = {}  # (semaphore, count) -> instruction id
        self._count: dict[int, int] = {}

    def record(self, instr: bir_pb2.Instruction) -> None:
        counts = self._count
        for update in instr.updates:
            semaphore = update.semaphore
            count = counts[semaphore] = counts.get(semaphore, 0) + update.increment
            self.by_count[(semaphore, count)] = instr.id

    def producer(self, wait: bir_pb2.SemaphoreWait) -> int:
        return self.by_count[(wait.semaphore, wait.value)]

