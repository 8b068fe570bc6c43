"""Where a run's functional effects land: in this process, or in a child on the other core.

Nothing the event loop decides depends on a value in memory: costs come from operand shapes,
waits and updates are the program's, and the race detector looks at operands, not data. So a
long run splits in two (issue 33: `ncc run` of a million instructions must not be the
bottleneck): this process runs the event loop, happens-before and race detection, and for each
instruction whose effect lands it sends the instruction's number (uid) down a pipe; a child
forked before the run, sharing the decoded program and device memory copy-on-write, applies the
effects in that order and sends the outputs back. The same effects in the same order on the same
memory: the outputs are those of a run in one process, bit for bit, and the two halves take
about the same time, so the run takes about half as long on two cores.

`Effects` does it in one process instead when the run is short (below PARALLEL_MIN_INSTRUCTIONS,
where a fork costs more than it saves), when an observer must see each effect as it lands, or
when fork is unavailable; and when the child dies or sends nothing usable, it applies every
effect again here, from the log of uids it keeps (8 bytes an instruction), as forked.Forked does.
"""

from __future__ import annotations

import bisect
import os
from array import array
from collections.abc import Callable, Iterable, Iterator

import numpy as np

from ncc.schemas import bir_pb2
from ncc.tools.common import dtypes, forked
from ncc.tools.sim import semantics
from ncc.tools.sim.instruction import Op
from ncc.tools.sim.memory import DeviceMemory
from ncc.tools.sim.program import EngineStream

PARALLEL_MIN_INSTRUCTIONS = 50_000  # executed, all inferences: below it a run stays in one process
_NEXT_INFERENCE = -1  # in the uid stream: the next inference starts (the streams run again)
_BATCH = 8192  # uids sent at once


def collect_outputs(memory: DeviceMemory) -> dict[str, np.ndarray]:
    """The OUTPUT tensors as user arrays, "out<N>" by index."""
    found = sorted(
        (tensor for tensor in memory.tensors.values() if tensor.role == bir_pb2.OUTPUT), key=lambda t: t.index
    )
    return {
        f"out{tensor.index}": dtypes.storage_to_user_array(memory.load_tensor(tensor.name), tensor.dtype)
        for tensor in found
    }


class _Replay:
    """Applies effects given by uid, in the order given: each engine's Ops are created in stream
    order and kept until their effect lands (a dma's lands after its engine has moved on)."""

    def __init__(self, streams: dict[int, EngineStream]) -> None:
        self.streams = sorted(streams.values(), key=lambda stream: stream.base_uid)
        self.bases = [stream.base_uid for stream in self.streams]
        self.restart()

    def restart(self) -> None:
        self.cursors: list[Iterator[Op]] = [stream.ops() for stream in self.streams]
        self.waiting: list[dict[int, Op]] = [{} for _ in self.streams]

    def apply(self, uids: Iterable[int]) -> None:
        with np.errstate(all="ignore"):
            for uid in uids:
                if uid == _NEXT_INFERENCE:
                    self.restart()
                    continue
                number = bisect.bisect_right(self.bases, uid) - 1
                waiting = self.waiting[number]
                op = waiting.pop(uid, None)
                while op is None:
                    made = next(self.cursors[number])
                    if made.uid == uid:
                        op = made
                    else:
                        waiting[made.uid] = made
                semantics.apply(op)


def _read_uids(fd: int) -> Iterator[array]:
    """Batches of uids from a pipe, until it closes."""
    pending = b""
    with os.fdopen(fd, "rb", buffering=0) as pipe:
        while chunk := pipe.read(1 << 16):
            pending += chunk
            whole = len(pending) - len(pending) % 8
            batch = array("q")
            batch.frombytes(pending[:whole])
            pending = pending[whole:]
            yield batch


class Effects:
    """Applies the effects of a run (all its inferences) in the order `apply` is called (the
    simulator calls `effect`: `apply`, or semantics.apply itself in one process); `outputs` says
    what the OUTPUT tensors hold at the end."""

    def __init__(
        self, streams: dict[int, EngineStream], memory: DeviceMemory, inferences: int, in_process: bool
    ) -> None:
        self.streams = streams
        self.memory = memory
        executed = inferences * sum(stream.length for stream in streams.values())
        parallel = not in_process and executed >= PARALLEL_MIN_INSTRUCTIONS
        self.effect: Callable[[Op], None] = semantics.apply
        self._worker: forked.Forked[dict[str, np.ndarray]] | None = None
        self._feed = -1  # the pipe's write end while the child reads it
        self._log = array("q")  # every uid sent, in order: what a fallback replays
        self._sent = 0
        if parallel:
            read_end, write_end = os.pipe()
            parent = os.getpid()

            def work() -> dict[str, np.ndarray]:
                replay = _Replay(self.streams)
                if os.getpid() == parent:  # the child failed: replay the log here
                    replay.apply(self._log)
                else:
                    os.close(write_end)
                    for batch in _read_uids(read_end):
                        replay.apply(batch)
                return collect_outputs(self.memory)

            self._worker = forked.Forked(work)
            self.effect = self.apply
            os.close(read_end)
            if self._worker.started:
                self._feed = write_end
            else:
                os.close(write_end)

    def apply(self, op: Op) -> None:
        """`op`'s effect lands now: send it to the child (log it, for a replay)."""
        self._log.append(op.uid)
        if len(self._log) - self._sent >= _BATCH:
            self._send()

    def next_inference(self) -> None:
        """The streams run again from the start (memory carried over)."""
        if self._worker is not None:
            self._log.append(_NEXT_INFERENCE)

    def outputs(self) -> dict[str, np.ndarray]:
        """The OUTPUT tensors after every effect applied."""
        if self._worker is None:
            return collect_outputs(self.memory)
        self._send()
        if self._feed >= 0:
            os.close(self._feed)
            self._feed = -1
        return self._worker.result()

    def close(self) -> None:
        """Stop the child, if it runs (the run ended before its outputs were asked for)."""
        if self._feed >= 0:
            os.close(self._feed)
            self._feed = -1
        if self._worker is not None:
            self._worker.cancel()

    def _send(self) -> None:
        if self._feed < 0:
            self._sent = len(self._log)
            return
        data = memoryview(self._log[self._sent :].tobytes())
        self._sent = len(self._log)
        try:
            while data:
                data = data[os.write(self._feed, data) :]
        except OSError:  # the child is gone: result() replays the log here
            os.close(self._feed)
            self._feed = -1
