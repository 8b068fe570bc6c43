"""Happens-before and race detection (docs/ir.md "Happens-before") with vector clocks.

Threads are the engines and the DMA queues. Each instruction (and each dma transfer) is one
event on its thread; its vector clock is its thread's clock joined with

  * for an engine instruction: the clocks of exactly the semaphore updates that brought each
    awaited semaphore up to the awaited value, in arrival order (`SemaphoreLog.cause`);
  * for a dma transfer: the clock of its trigger (which already holds the trigger's waits).

An access A (thread t, own clock c) happens before an event with clock V iff c <= V[t].
`RaceDetector` keeps, per memory region, a columnar history of accesses (thread, clock,
partition range, byte hull, read/write) and checks each new access against it with numpy; hull
overlaps are refined with the exact byte intervals before a race is reported. Each racing pair
of instructions is reported once. Entries that happen before every event still to come (the
element-wise minimum of the live threads' clocks, supplied by the simulator) can never race
again and are pruned, which keeps the history, and the check, small.
"""

from __future__ import annotations

import bisect
from collections.abc import Callable
from dataclasses import dataclass

import numpy as np

from ncc.tools.sim.memory import Access


@dataclass
class Race:
    """Two conflicting accesses (at least one a write) that no happens-before orders."""

    first: str  # the earlier-recorded access: instruction name and engine/queue, e.g. "'add3' (DVE)"
    second: str
    memory: str  # where they meet, e.g. "SBUF partitions 0-127 bytes 0-2047" or "HBM tensor x bytes 0-63"
    first_access: str = "write"
    second_access: str = "write"

    def describe(self) -> str:
        return (
            f"race on {self.memory}: {self.first} {self.first_access}s and {self.second} "
            f"{self.second_access}s with no semaphore ordering them"
        )


class VectorClocks:
    """One clock per thread; `tick` creates the clock of the thread's next event."""

    def __init__(self, threads: int) -> None:
        self.clocks = np.zeros((threads, threads), dtype=np.int64)

    def tick(self, thread: int, joins: list[np.ndarray]) -> np.ndarray:
        clock = self.clocks[thread]
        for other in joins:
            np.maximum(clock, other, out=clock)
        clock[thread] += 1
        return clock.copy()

    def frontier(self, threads: list[int]) -> np.ndarray | None:
        """Element-wise minimum over `threads`' clocks (None if there are none)."""
        if not threads:
            return None
        return self.clocks[threads].min(axis=0)


class SemaphoreLog:
    """Per semaphore, the updates in arrival order: running count and running join of their clocks."""

    def __init__(self, semaphores: int) -> None:
        self.counts: list[list[int]] = [[] for _ in range(semaphores)]
        self.joins: list[list[np.ndarray]] = [[] for _ in range(semaphores)]
        self.monotonic = [True] * semaphores

    def record(self, semaphore: int, count_after: int, clock: np.ndarray) -> None:
        counts, joins = self.counts[semaphore], self.joins[semaphore]
        if counts and count_after < counts[-1]:
            self.monotonic[semaphore] = False
        counts.append(count_after)
        joins.append(np.maximum(joins[-1], clock) if joins else clock.copy())

    def reset(self) -> None:
        """Every semaphore back to 0 (a `sem_reset`): later waits are caused by later updates only."""
        for semaphore in range(len(self.counts)):
            self.counts[semaphore] = []
            self.joins[semaphore] = []
            self.monotonic[semaphore] = True

    def cause(self, semaphore: int, value: int) -> np.ndarray | None:
        """Join of the clocks of the updates that first brought `semaphore` to >= `value`."""
        if value <= 0:
            return None
        counts = self.counts[semaphore]
        if self.monotonic[semaphore]:
            index = bisect.bisect_left(counts, value)
        else:
            index = next((i for i, count in enumerate(counts) if count >= value), len(counts))
        if index >= len(counts):
            return None
        return self.joins[semaphore][index]


@dataclass
class _Entry:
    access: Access
    label: str
    uid: int
    write: bool


class _RegionHistory:
    """Columnar access history of one memory region."""

    def __init__(self) -> None:
        self.size = 0
        capacity = 64
        self.thread = np.zeros(capacity, dtype=np.int64)
        self.clock = np.zeros(capacity, dtype=np.int64)
        self.p_lo = np.zeros(capacity, dtype=np.int64)
        self.p_hi = np.zeros(capacity, dtype=np.int64)
        self.b_lo = np.zeros(capacity, dtype=np.int64)
        self.b_hi = np.zeros(capacity, dtype=np.int64)
        self.write = np.zeros(capacity, dtype=bool)
        self.entries: list[_Entry] = []
        self.compact_at = 256

    _COLUMNS = ("thread", "clock", "p_lo", "p_hi", "b_lo", "b_hi", "write")

    def conflicts(self, thread: int, clock: np.ndarray, access: Access, write: bool) -> np.ndarray:
        """Indices of prior accesses that overlap `access` by hull, conflict, and are unordered."""
        n = self.size
        if n == 0:
            return np.empty(0, dtype=np.int64)
        mask = (self.b_lo[:n] < access.byte_hi) & (self.b_hi[:n] > access.byte_lo)
        mask &= (self.p_lo[:n] < access.part_hi) & (self.p_hi[:n] > access.part_lo)
        if not write:
            mask &= self.write[:n]
        threads = self.thread[:n]
        mask &= threads != thread
        mask &= self.clock[:n] > clock[threads]
        return np.flatnonzero(mask)

    def append(self, thread: int, own_clock: int, access: Access, entry: _Entry) -> None:
        if self.size == len(self.thread):
            for column in self._COLUMNS:
                old = getattr(self, column)
                grown = np.zeros(2 * len(old), dtype=old.dtype)
                grown[: len(old)] = old
                setattr(self, column, grown)
        i = self.size
        self.thread[i], self.clock[i] = thread, own_clock
        self.p_lo[i], self.p_hi[i] = access.part_lo, access.part_hi
        self.b_lo[i], self.b_hi[i] = access.byte_lo, access.byte_hi
        self.write[i] = entry.write
        self.entries.append(entry)
        self.size += 1

    def prune(self, frontier: np.ndarray | None) -> None:
        """Drop entries that happen before every future event (`frontier` None: no future events)."""
        n = self.size
        if frontier is None:
            keep = np.zeros(n, dtype=bool)
        else:
            keep = self.clock[:n] > frontier[self.thread[:n]]
        kept = np.flatnonzero(keep)
        for column in self._COLUMNS:
            values = getattr(self, column)
            values[: len(kept)] = values[kept]
        self.entries = [self.entries[i] for i in kept]
        self.size = len(kept)
        self.compact_at = max(256, 2 * self.size)


class RaceDetector:
    """Checks every access against the unordered conflicting accesses recorded before it.

    After `max_races` distinct racing pairs it stops looking (`capped`): a program that races
    everywhere has O(n²) racing pairs, and counting them all would turn a verdict into hours."""

    def __init__(self, frontier: Callable[[], np.ndarray | None], max_races: int = 10000) -> None:
        self.frontier = frontier
        self.max_races = max_races
        self.regions: dict[str, _RegionHistory] = {}
        self.races: list[Race] = []
        self.race_count = 0
        self._reported: set[tuple[int, int]] = set()

    @property
    def capped(self) -> bool:
        """True once `max_races` pairs were found: the count is then a lower bound."""
        return self.race_count >= self.max_races

    def access(
        self, thread: int, clock: np.ndarray, access: Access, write: bool, uid: int, label: str
    ) -> None:
        """Record one access by the event with vector clock `clock` on `thread`, reporting races."""
        if access.empty or self.capped:
            return
        history = self.regions.get(access.region)
        if history is None:
            history = self.regions[access.region] = _RegionHistory()
        for index in history.conflicts(thread, clock, access, write):
            prior = history.entries[int(index)]
            pair = (min(prior.uid, uid), max(prior.uid, uid))
            if prior.uid == uid or pair in self._reported or not prior.access.overlaps(access):
                continue
            self._reported.add(pair)
            self.race_count += 1
            if self.capped:
                break
            if len(self.races) < self.max_races:
                self.races.append(
                    Race(
                        first=prior.label,
                        second=label,
                        memory=prior.access.describe_overlap(access),
                        first_access="write" if prior.write else "read",
                        second_access="write" if write else "read",
                    )
                )
        history.append(thread, int(clock[thread]), access, _Entry(access, label, uid, write))
        if history.size >= history.compact_at:
            history.prune(self.frontier())
