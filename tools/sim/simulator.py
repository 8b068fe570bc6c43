"""The discrete-event engine loop: who runs what, when, and in which order effects land.

Each engine runs its stream in order. The head instruction starts when the engine is free, every
wait (semaphore >= value) holds and the shared ports it needs are free; it completes `cost_ns`
later, and only then are its functional effect applied and its updates added. A dma's waits are
checked by its trigger engine, which is busy for the issue time; when the trigger is done the
transfer joins its queue (FIFO), moves for `transfer_ns`, and its copy and updates land when it
completes. Transfers that touch HBM also share the core's aggregate HBM bandwidth: each reserves
`hbm_ns` of a single HBM channel in the order transfers start (after the fixed latency), and ends
no earlier than its reservation, so 16 busy queues move at most hbm_bandwidth_gbps together.
A `sem_reset` (SP) sets every semaphore to 0 when it completes; `initial_counts` lets a run start
from where the previous inference left the semaphores (the runtime does not touch them between
inferences), and `Outcome.final_counts` says where this one left them.
The SBUF port that DVE and POOL share is claimed at dispatch (tools/target/costs.py): as soon as
the engine is free and the head instruction needs the port and finds it unclaimed and idle, the
instruction holds it, and only then waits for its semaphores; it lets go when it completes. A
POOL instruction that holds the port while waiting for DVE work that needs the port deadlocks,
and the diagnosis names the port.
Events at one timestamp are all processed (in the order they were created) before anything new
starts. When no event is pending and streams are unfinished the run is deadlocked
and deadlock.py explains why. The loop always ends: each instruction starts once and each event
is processed once.

Each engine's instructions come from its `EngineStream` (program.py), which creates the Op of a
loop instance when the engine reaches it: the loop runs as its expansion would, without the
expansion ever being held in memory.

Happens-before is tracked alongside (hb.py) when race checking is on: one thread per engine and
per (queue, trigger engine) pair the program uses, clocks ticked as instructions start and
transfers are queued.
A queue moves its transfers in FIFO order, but transfers that different engines issue onto one
queue interleave in an order only the run decides, so that order is no synchronization (as in
the compiler's model, docs/ir.md): a store issued too early that happens to go ahead of a load
on the same queue is a race, not an ordering.

A `ScheduleRecorder` (trace.py), when given, is told when each instruction's waits held, when it
started and ended and when each transfer moved; without one the loop records nothing. An
`observer`, when given, is called with each op right after its functional effect landed (what
`ncc bisect` uses to find the first instruction whose result differs). `effect` applies the
functional effect: semantics.apply, or effects.py's hand-over to a child process (nothing in the
loop depends on a value in memory).
"""

from __future__ import annotations

import heapq
import itertools
from collections import deque
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field

import numpy as np

from ncc.tools.sim import semantics
from ncc.tools.sim.deadlock import BlockedPort, BlockedWait, PendingUpdate, describe_deadlock
from ncc.tools.sim.hb import Race, RaceDetector, SemaphoreLog, VectorClocks
from ncc.tools.sim.instruction import Op, engine_name, queue_name
from ncc.tools.sim.program import EngineStream, locate
from ncc.tools.sim.trace import ScheduleRecorder
from ncc.tools.target import ENGINES, Target

_COMPLETE, _TRIGGERED, _TRANSFERRED = "complete", "triggered", "transferred"


@dataclass
class _Engine:
    """An engine's progress through its stream: `head` is the instruction at `pc` (None past the end)."""

    engine: int
    thread: int
    stream: EngineStream | None
    length: int = 0
    pc: int = 0
    head: Op | None = None
    cursor: Iterator[Op] = field(default_factory=lambda: iter(()))
    running: Op | None = None
    busy_ns: float = 0.0

    @classmethod
    def of(cls, engine: int, thread: int, stream: EngineStream | None) -> _Engine:
        if stream is None:
            return cls(engine, thread, None)
        cursor = stream.ops()
        return cls(engine, thread, stream, stream.length, head=next(cursor, None), cursor=cursor)

    def advance(self) -> None:
        self.pc += 1
        self.head = next(self.cursor, None)

    @property
    def live(self) -> bool:
        return self.running is not None or self.pc < self.length


@dataclass
class Outcome:
    """What one run produced besides memory contents."""

    simulated_ns: float
    deadlock: str | None
    races: list[Race]
    race_count: int
    races_capped: bool  # the detector stopped at its limit: race_count is a lower bound
    engine_busy_ns: dict[str, float]
    instruction_count: int
    final_counts: list[int]  # each semaphore's count when the run ended
    hbm_bytes: int  # bytes the transfers that touch HBM moved


class Simulator:
    """Runs decoded per-engine streams to completion (or deadlock)."""

    def __init__(
        self,
        streams: dict[int, EngineStream],
        target: Target,
        num_semaphores: int,
        check_races: bool,
        recorder: ScheduleRecorder | None = None,
        observer: Callable[[Op], None] | None = None,
        initial_counts: list[int] | None = None,
        effect: Callable[[Op], None] = semantics.apply,
    ) -> None:
        self.target = target
        self.recorder = recorder
        self.observer = observer
        self.effect = effect  # applies an op's functional effect (effects.py: maybe in a child)
        self.streams = streams
        engine_ids = list(ENGINES.values())
        self.engines = [_Engine.of(e, i, streams.get(e)) for i, e in enumerate(engine_ids)]
        # the happens-before thread of each (queue, trigger engine)'s transfers
        pairs = sorted({(q, stream.engine) for stream in streams.values() for q in stream.dma_queues()})
        self.transfer_thread = {pair: len(engine_ids) + number for number, pair in enumerate(pairs)}
        # each queue's transfers waiting for it (op, happens-before clock, when queued), and
        # whether it is moving one now: a transfer starts when its queue is done with the last
        self.queue_waiting: list[deque[tuple[Op, np.ndarray | None, float]]] = [
            deque() for _ in range(target.dma_queues)]
        self.queue_moving = [False] * target.dma_queues
        self.hbm_free_ns = 0.0  # when the aggregate HBM channel has moved every reserved byte
        self.hbm_bytes = 0  # moved by the transfers that touch HBM so far
        self.queue_busy_ns = [0.0] * target.dma_queues
        self.queue_used = [False] * target.dma_queues
        self.counts = list(initial_counts) if initial_counts is not None else [0] * num_semaphores
        self.port_free_ns: dict[str, float] = {}
        self.port_claims: dict[str, _Engine] = {}  # DISPATCH_CLAIMED_PORTS held by a waiting head
        self.events: list[tuple[float, int, str, object]] = []
        self.sequence = itertools.count()
        self.now = 0.0
        self.started = 0
        threads = len(engine_ids) + len(pairs)
        self.clocks = VectorClocks(threads) if check_races else None
        self.sem_log = SemaphoreLog(num_semaphores, threads) if check_races else None
        self.races = RaceDetector(self._frontier, self._label) if check_races else None

    # ---- the loop --------------------------------------------------------------------------

    def run(self) -> Outcome:
        with np.errstate(all="ignore"):  # once for the run: semantics.apply leaves it alone
            self._loop()
        deadlock = self._deadlock() if any(e.live for e in self.engines) else None
        if self.recorder is not None:
            stuck = [e.head for e in self.engines if e.running is None and e.head is not None]
            self.recorder.finished(self.now, stuck)
        busy = {engine_name(e.engine): e.busy_ns for e in self.engines}
        for queue, used in enumerate(self.queue_used):
            if used:
                busy[queue_name(queue)] = self.queue_busy_ns[queue]
        return Outcome(
            simulated_ns=self.now,
            deadlock=deadlock,
            races=list(self.races.races) if self.races else [],
            race_count=self.races.race_count if self.races else 0,
            races_capped=self.races.capped if self.races else False,
            engine_busy_ns=busy,
            instruction_count=self.started,
            final_counts=list(self.counts),
            hbm_bytes=self.hbm_bytes,
        )

    def _loop(self) -> None:
        events = self.events
        while True:
            self._start_ready()
            if not events:
                break
            time = events[0][0]
            self.now = time
            while events and events[0][0] == time:
                _, _, kind, payload = heapq.heappop(events)
                self._handle(kind, payload)

    def _push(self, time: float, kind: str, payload: object) -> None:
        heapq.heappush(self.events, (time, next(self.sequence), kind, payload))

    def _start_ready(self) -> None:
        counts, now = self.counts, self.now
        for engine in self.engines:
            op = engine.head
            if engine.running is not None or op is None:
                continue
            if op.dispatch_ports and not self._claim_at_dispatch(engine, op):
                continue
            waiting = False
            for semaphore, value in op.waits:
                if counts[semaphore] < value:
                    waiting = True
                    break
            if waiting:
                continue
            if self.recorder is not None:
                self.recorder.waits_met(engine.engine, now)
            if op.ports and any(self.port_free_ns.get(p, 0.0) > now for p in op.ports):
                continue
            self._start(engine, op)

    def _claim_at_dispatch(self, engine: _Engine, op: Op) -> bool:
        """Claim the dispatch-arbitrated ports `op` needs; False while another engine has one."""
        wanted = op.dispatch_ports
        for port in wanted:
            holder = self.port_claims.get(port)
            if holder is not None and holder is not engine:
                return False
            if holder is None and self.port_free_ns.get(port, 0.0) > self.now:
                return False
        for port in wanted:
            self.port_claims[port] = engine
        return True

    def _start(self, engine: _Engine, op: Op) -> None:
        engine.advance()
        engine.running = op
        engine.busy_ns += op.cost_ns
        self.started += 1
        end = self.now + op.cost_ns
        for port in op.ports:
            self.port_free_ns[port] = end
        if self.recorder is not None:
            self.recorder.started(op, self.now, end)
        clock = None
        if self.clocks is not None:
            joins = []
            for semaphore, value in op.waits:
                cause = self.sem_log.cause(semaphore, value)
                if cause is not None:
                    joins.append(cause)
            clock = self.clocks.tick(engine.thread, joins)
            if not op.is_dma:
                self._record(engine.thread, clock, op)
        self._push(end, _TRIGGERED if op.is_dma else _COMPLETE, (engine, op, clock))

    def _handle(self, kind: str, payload: object) -> None:
        if kind == _COMPLETE:
            engine, op, clock = payload
            self._execute(op)
            self._update(op, clock)
            engine.running = None
            for port in op.ports:
                if self.port_claims.get(port) is engine:
                    del self.port_claims[port]
        elif kind == _TRIGGERED:
            engine, op, clock = payload
            transfer_clock = None
            if self.clocks is not None:
                thread = self.transfer_thread[op.queue, engine.engine]
                transfer_clock = self.clocks.tick(thread, [clock])
                self._record(thread, transfer_clock, op)
            engine.running = None
            self.queue_waiting[op.queue].append((op, transfer_clock, self.now))
            if not self.queue_moving[op.queue]:
                self._move_next(op.queue)
        else:
            op, clock = payload
            self._execute(op)
            self._update(op, clock)
            self.queue_moving[op.queue] = False
            if self.queue_waiting[op.queue]:
                self._move_next(op.queue)

    def _move_next(self, queue: int) -> None:
        """Start the transfer first in line on `queue` (which is idle): it holds the queue for
        `transfer_ns`, and one that touches HBM reserves its bytes' time on the HBM channel from
        now, after the fixed latency, so the channel serves transfers in the order they start (a
        transfer still waiting behind its queue's backlog reserves nothing yet)."""
        op, clock, queued = self.queue_waiting[queue].popleft()
        start = self.now
        end = start + op.transfer_ns
        if op.hbm_ns:
            data_start = max(start + self.target.dma_fixed_latency_ns, self.hbm_free_ns)
            self.hbm_free_ns = data_start + op.hbm_ns
            self.hbm_bytes += op.moved_bytes
            end = max(end, self.hbm_free_ns)
        self.queue_moving[queue] = True
        self.queue_busy_ns[queue] += end - start
        self.queue_used[queue] = True
        if self.recorder is not None:
            self.recorder.transferred(op, queued, start, end)
        self._push(end, _TRANSFERRED, (op, clock))

    def _execute(self, op: Op) -> None:
        self.effect(op)
        if self.observer is not None:
            self.observer(op)

    def _update(self, op: Op, clock: np.ndarray | None) -> None:
        if op.op == "sem_reset":
            self.counts = [0] * len(self.counts)
            if self.sem_log is not None:
                self.sem_log.reset()
        for semaphore, increment in op.updates:
            self.counts[semaphore] += increment
            if self.sem_log is not None:
                self.sem_log.record(semaphore, self.counts[semaphore], clock)

    # ---- happens-before ----------------------------------------------------------------------

    def _record(self, thread: int, clock: np.ndarray, op: Op) -> None:
        values = clock.tolist()
        for access in op.inputs:
            self.races.access(thread, values, access, False, op.uid)
        for access in op.outputs:
            self.races.access(thread, values, access, True, op.uid)

    def _label(self, uid: int, thread: int) -> str:
        """Instruction `uid` as races name it: on its engine's thread or its transfer's."""
        stream, position = locate(self.streams, uid)
        op = stream.op_at(position)
        return op.label if thread < len(self.engines) else op.transfer_label

    def _frontier(self) -> np.ndarray | None:
        """Minimum clock of every event still to come (engines with work left; queued transfers
        were recorded when queued and every later one is ordered after a live engine's trigger)."""
        return self.clocks.frontier([e.thread for e in self.engines if e.live])

    # ---- deadlock ----------------------------------------------------------------------------

    def _deadlock(self) -> str:
        blocked: list[BlockedWait] = []
        pending: list[PendingUpdate] = []
        ports: list[BlockedPort] = []
        for engine in self.engines:
            head = engine.head
            if head is None:
                continue
            name = engine_name(engine.engine)
            for port in head.ports:
                holder = self.port_claims.get(port)
                if holder is not None and holder is not engine:
                    holder_name = engine_name(holder.engine)
                    ports.append(BlockedPort(name, head.name, port, holder_name, holder.head.name))
            for semaphore, value in head.waits:
                if self.counts[semaphore] < value:
                    blocked.append(BlockedWait(name, head.name, semaphore, value, self.counts[semaphore]))
            # per semaphore the first positive update and the sum of all: the diagnosis looks at no more
            for instruction, semaphore, total in engine.stream.positive_updates(engine.pc):
                pending.append(PendingUpdate(name, instruction, semaphore, total))
        return describe_deadlock(blocked, pending, ports)
