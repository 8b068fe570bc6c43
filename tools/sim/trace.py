"""The schedule trace: what the timing simulation did, when, as Chrome Trace Event Format JSON.

The simulator records into a `ScheduleRecorder` only when asked (api.simulate_neff(...,
record_schedule=True)); `chrome_trace` turns the recorded `Schedule` into the JSON object that
Perfetto (ui.perfetto.dev) and chrome://tracing open. One process ("ncc sim"), one track (tid)
per engine that ran something and per DMA queue that moved something, all times in microseconds
(the simulator counts ns). On an engine track:

- every instruction is one complete event ("ph": "X", "cat": "instruction"; a dma's is its
  trigger's issue time), so their number is the run's instruction count;
- "wait" ("cat": "semaphore_wait") covers the time the instruction was the engine's next one and
  the engine was free, but a semaphore wait did not hold yet; an instruction that never started
  (a deadlock) waits until the end of the run;
- "port wait" ("cat": "port_wait") covers the time its waits held but a shared memory port it needs
  was busy.

On a queue track, each dma's data movement is one "X" event ("cat": "dma_transfer"); its updates
land when it ends. A dma's two events share `args.id`.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from ncc.tools.sim.instruction import Op, engine_name, queue_name
from ncc.tools.target import ENGINES

PROCESS_NAME = "ncc sim"
_PID = 1
# Stalls shorter than the trace's resolution (times are kept to 0.001 ns) are not shown.
MIN_SLICE_NS = 0.001


@dataclass
class EngineSlice:
    """One instruction on its engine: free for it at `ready_ns`, waits held at `waits_met_ns`,
    running [start_ns, end_ns). A deadlocked head has `end_ns` None (it never started)."""

    op: Op
    ready_ns: float
    waits_met_ns: float
    start_ns: float
    end_ns: float | None


@dataclass
class Transfer:
    """One dma's data on its queue: queued at `queued_ns` (trigger done), moving [start_ns, end_ns)."""

    op: Op
    queued_ns: float
    start_ns: float
    end_ns: float


@dataclass
class Schedule:
    """Everything a traced run recorded; `ids` maps an op's uid to its BIR instruction id."""

    slices: list[EngineSlice] = field(default_factory=list)
    transfers: list[Transfer] = field(default_factory=list)
    simulated_ns: float = 0.0
    ids: list[int] = field(default_factory=list)


class ScheduleRecorder:
    """What the simulator calls while it runs (only when tracing; see simulator.py)."""

    def __init__(self) -> None:
        self.schedule = Schedule()
        self._free_ns: dict[int, float] = {}  # engine → when its last instruction ended
        self._waits_met_ns: dict[int, float] = {}  # engine → when its head's waits first held

    def waits_met(self, engine: int, now: float) -> None:
        """The engine is free and its next instruction's waits hold (it may still lack a port)."""
        self._waits_met_ns.setdefault(engine, now)

    def started(self, op: Op, now: float, end: float) -> None:
        ready = self._free_ns.get(op.engine, 0.0)
        met = self._waits_met_ns.pop(op.engine, now)
        self.schedule.slices.append(EngineSlice(op, ready, max(ready, met), now, end))
        self._free_ns[op.engine] = end

    def transferred(self, op: Op, queued: float, start: float, end: float) -> None:
        self.schedule.transfers.append(Transfer(op, queued, start, end))

    def finished(self, now: float, stuck: list[Op]) -> None:
        """The run ended at `now`; `stuck` are engines' next instructions that never started."""
        for op in stuck:
            ready = self._free_ns.get(op.engine, 0.0)
            self.schedule.slices.append(EngineSlice(op, ready, now, now, None))
        self.schedule.simulated_ns = now


def _us(ns: float) -> float:
    return round(ns / 1000.0, 6)


def _sync_args(op: Op) -> dict[str, Any]:
    return {
        "waits": [{"semaphore": s, "value": v} for s, v in op.waits],
        "updates": [{"semaphore": s, "increment": i} for s, i in op.updates],
    }


def _event(name: str, cat: str, tid: int, start_ns: float, end_ns: float, args: dict[str, Any]) -> dict:
    ts = _us(start_ns)
    return {
        "name": name,
        "cat": cat,
        "ph": "X",
        "ts": ts,
        "dur": max(0.0, round(_us(end_ns) - ts, 6)),
        "pid": _PID,
        "tid": tid,
        "args": args,
    }


def chrome_trace(schedule: Schedule, metadata: dict[str, Any] | None = None) -> dict[str, Any]:
    """The Trace Event Format object ({"traceEvents": [...], ...}) of a recorded schedule."""
    engine_tid = {engine: index for index, engine in enumerate(ENGINES.values())}

    def queue_tid(queue: int) -> int:
        return len(engine_tid) + queue

    def instruction_id(op: Op) -> int:
        return schedule.ids[op.uid] if op.uid < len(schedule.ids) else op.uid

    events: list[dict[str, Any]] = []
    tracks: dict[int, str] = {}
    for piece in schedule.slices:
        op, tid = piece.op, engine_tid[piece.op.engine]
        tracks[tid] = engine_name(op.engine)
        who = {
            "instruction": op.name,
            "id": instruction_id(op),
            "op": op.op,
            "engine": engine_name(op.engine),
        }
        if piece.waits_met_ns - piece.ready_ns >= MIN_SLICE_NS or piece.end_ns is None:
            stall = {**who, "waits": [{"semaphore": s, "value": v} for s, v in op.waits]}
            if piece.end_ns is None:
                stall["deadlock"] = True
            events.append(_event("wait", "semaphore_wait", tid, piece.ready_ns, piece.waits_met_ns, stall))
        if piece.end_ns is None:
            continue
        if piece.start_ns - piece.waits_met_ns >= MIN_SLICE_NS:
            ports = {**who, "ports": list(op.ports)}
            events.append(_event("port wait", "port_wait", tid, piece.waits_met_ns, piece.start_ns, ports))
        args: dict[str, Any] = {"id": instruction_id(op), "op": op.op, "engine": engine_name(op.engine)}
        if op.is_dma:
            args["queue"] = queue_name(op.queue)
        if op.func:
            args["func"] = op.func
        args.update(_sync_args(op))
        events.append(_event(op.name, "instruction", tid, piece.start_ns, piece.end_ns, args))
    for transfer in schedule.transfers:
        op, tid = transfer.op, queue_tid(transfer.op.queue)
        tracks[tid] = f"DMA {queue_name(op.queue)}"
        args = {
            "id": instruction_id(op),
            "op": op.op,
            "queue": queue_name(op.queue),
            "trigger_engine": engine_name(op.engine),
            "queued_us": _us(transfer.queued_ns),
            "bytes": op.inputs[0].nbytes if op.inputs else 0,
            **_sync_args(op),
        }
        events.append(_event(op.name, "dma_transfer", tid, transfer.start_ns, transfer.end_ns, args))
    events.sort(key=lambda event: (event["tid"], event["ts"]))

    meta: list[dict[str, Any]] = [
        {"name": "process_name", "ph": "M", "pid": _PID, "tid": 0, "args": {"name": PROCESS_NAME}}
    ]
    for tid in sorted(tracks):
        meta.append(
            {"name": "thread_name", "ph": "M", "pid": _PID, "tid": tid, "args": {"name": tracks[tid]}}
        )
        meta.append(
            {"name": "thread_sort_index", "ph": "M", "pid": _PID, "tid": tid, "args": {"sort_index": tid}}
        )
    return {
        "traceEvents": meta + events,
        "displayTimeUnit": "ns",
        "otherData": {
            **(metadata or {}),
            "simulated_ns": schedule.simulated_ns,
            "instruction_count": sum(1 for piece in schedule.slices if piece.end_ns is not None),
        },
    }
