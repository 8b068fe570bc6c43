"""Happens-before and race detection (docs/ir.md "Happens-before") with vector clocks.

Threads are the engines and the (DMA queue, trigger engine) pairs the program uses. Each
instruction (and each dma transfer) is one event on its thread; its vector clock is its thread's
clock joined with

  * for an engine instruction: the clocks of exactly the semaphore updates that brought each
    awaited semaphore up to the awaited value, in arrival order (`SemaphoreLog.cause`);
  * for a dma transfer: the clock of its trigger (which already holds the trigger's waits).

An access A (thread t, own clock c) happens before an event with clock V iff c <= V[t]. Every
access is checked against every earlier conflicting access (at least one a write) to an
overlapping byte by another thread that does not happen before it; each racing pair of
instructions is reported once, in the order the earlier accesses were recorded.

`RaceDetector` files accesses by footprint: the exact geometry of an operand (region, partitions,
byte pattern), which a loop's iterations revisit. Footprints that share a byte are linked once,
when the second one is first seen (the exact byte test runs then, not per access), and each keeps,
per thread, the own clocks of its reads and of its writes in recording order, which is increasing
order. A new access therefore only compares, for each overlapping footprint and thread, the
latest clock with its own vector clock: an access races with a thread's entries exactly when the
latest one is unordered with it, and then the unordered ones are the tail of that list. The
check costs the same however long the history is, and a history entry is three integers
(its clock, instruction and recording order); the labels of the instructions are asked for
(`label`) only when a race is reported. Entries that happen before every event still to come (the
element-wise minimum of the live threads' clocks, supplied by the simulator) can never race
again and are pruned, and footprints left without entries are dropped.
"""

from __future__ import annotations

import bisect
from array import array
from collections.abc import Callable
from dataclasses import dataclass

import numpy as np

from ncc.schemas.common_pb2 import HBM
from ncc.tools.sim.memory import Access

_ONCHIP_BUCKET = 512  # bytes of a partition per bucket of the race detector's footprint index
_HBM_BUCKET = 65536


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
        self.rows = list(self.clocks)  # each thread's clock, a view made once

    def tick(self, thread: int, joins: list[np.ndarray]) -> np.ndarray:
        clock = self.rows[thread]
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
    """Per semaphore, the updates in arrival order: running count and running join of their clocks
    (the joins as rows of one growing array per semaphore: a vector clock's bytes per update)."""

    def __init__(self, semaphores: int, threads: int) -> None:
        self.threads = threads
        self.counts: list[list[int]] = [[] for _ in range(semaphores)]
        self.joins = [np.zeros((0, threads), dtype=np.int64) for _ in range(semaphores)]
        self.monotonic = [True] * semaphores

    def record(self, semaphore: int, count_after: int, clock: np.ndarray) -> None:
        counts, joins = self.counts[semaphore], self.joins[semaphore]
        n = len(counts)
        if counts and count_after < counts[-1]:
            self.monotonic[semaphore] = False
        counts.append(count_after)
        if n == len(joins):
            grown = np.zeros((max(16, 2 * n), self.threads), dtype=np.int64)
            grown[:n] = joins
            joins = self.joins[semaphore] = grown
        if n:
            np.maximum(joins[n - 1], clock, out=joins[n])
        else:
            joins[0] = clock

    def reset(self) -> None:
        """Every semaphore back to 0 (a `sem_reset`): later waits are caused by later updates only."""
        for semaphore in range(len(self.counts)):
            self.counts[semaphore] = []
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


class _Log:
    """One thread's reads or writes of one footprint: own clocks, instruction uids and recording
    order (`seq`), in recording order."""

    __slots__ = ("clocks", "seqs", "uids")

    def __init__(self) -> None:
        self.clocks = array("q")
        self.uids = array("q")
        self.seqs = array("q")

    def drop_through(self, clock: int) -> int:
        """Drop the entries whose clock is at most `clock`; how many were dropped."""
        cut = bisect.bisect_right(self.clocks, clock)
        if cut:
            del self.clocks[:cut], self.uids[:cut], self.seqs[:cut]
        return cut


class _Footprint:
    """Every recorded access of one exact geometry, by kind and thread, and the footprints it shares
    a byte with (itself included)."""

    __slots__ = ("access", "buckets", "detector", "key", "overlapping", "reads", "writes")

    def __init__(self, key: tuple, access: Access, buckets: range | None, detector: object) -> None:
        self.key = key
        self.access = access  # the first access seen: where messages read the geometry
        self.buckets = buckets  # the region's buckets it is filed in (None: a wide footprint)
        self.detector = detector  # whose it is (None once dropped): an Access caches its footprint
        self.reads: dict[int, _Log] = {}
        self.writes: dict[int, _Log] = {}
        # the footprints whose hull meets this one's: do they share a byte (None: not known yet)
        self.overlapping: dict[_Footprint, bool | None] = {}


class _Region:
    """The footprints of one memory region, found by key and by the byte buckets they cover
    (`bucket_bytes` wide: on chip a partition's bytes are few and tiles small, in HBM not)."""

    MAX_BUCKETS = 64  # a footprint spanning more is wide: compared with every new footprint

    def __init__(self, bucket_bytes: int) -> None:
        self.bucket_bytes = bucket_bytes
        self.by_key: dict[tuple, _Footprint] = {}
        self.buckets: dict[int, dict[_Footprint, None]] = {}
        self.wide: dict[_Footprint, None] = {}

    def footprint(self, access: Access, detector: object) -> _Footprint:
        key = (
            access.part_lo, access.part_hi, access.byte_lo, access.byte_hi, access.base, access.counts,
            access.byte_strides, access.dtype,
        )
        found = self.by_key.get(key)
        if found is not None:
            return found
        first, last = access.byte_lo // self.bucket_bytes, (access.byte_hi - 1) // self.bucket_bytes
        buckets = range(first, last + 1) if last - first < self.MAX_BUCKETS else None
        footprint = _Footprint(key, access, buckets, detector)
        p_lo, p_hi, b_lo, b_hi = access.part_lo, access.part_hi, access.byte_lo, access.byte_hi
        seen: set[_Footprint] = set()
        near = [self.buckets.get(b, {}) for b in buckets] if buckets else list(self.buckets.values())
        for filed in (self.wide, *near):
            for other in filed:
                known = other.access  # the hulls first: most neighbours in a bucket do not meet
                apart = known.part_hi <= p_lo or p_hi <= known.part_lo
                if apart or known.byte_hi <= b_lo or b_hi <= known.byte_lo or other in seen:
                    continue
                seen.add(other)
                other.overlapping[footprint] = footprint.overlapping[other] = None
        footprint.overlapping[footprint] = True
        self.by_key[key] = footprint
        if buckets is None:
            self.wide[footprint] = None
        else:
            for bucket in buckets:
                self.buckets.setdefault(bucket, {})[footprint] = None
        return footprint

    def drop(self, footprint: _Footprint) -> None:
        footprint.detector = None
        del self.by_key[footprint.key]
        for other in footprint.overlapping:
            if other is not footprint:
                del other.overlapping[footprint]
        if footprint.buckets is None:
            del self.wide[footprint]
        else:
            for bucket in footprint.buckets:
                filed = self.buckets[bucket]
                del filed[footprint]
                if not filed:
                    del self.buckets[bucket]


def _share_bytes(footprint: _Footprint, other: _Footprint) -> bool:
    """The exact test of two footprints whose hulls meet (numpy: made once per pair, when needed)."""
    shared = other.access.overlaps(footprint.access)
    footprint.overlapping[other] = other.overlapping[footprint] = shared
    return shared


class RaceDetector:
    """Checks every access against the unordered conflicting accesses recorded before it.

    After `max_races` distinct racing pairs it stops looking (`capped`): a program that races
    everywhere has O(n²) racing pairs, and counting them all would turn a verdict into hours.
    `label(uid, thread)` names an instruction as races name it (e.g. "'add3' (DVE)")."""

    def __init__(
        self,
        frontier: Callable[[], np.ndarray | None],
        label: Callable[[int, int], str],
        max_races: int = 10000,
    ) -> None:
        self.frontier = frontier
        self.label = label
        self.max_races = max_races
        self.regions: dict[str, _Region] = {}
        self.races: list[Race] = []
        self.race_count = 0
        self._reported: set[tuple[int, int]] = set()
        self._seq = 0  # accesses recorded so far: the order races are reported in
        self._size = 0  # entries held
        self._compact_at = 4096
        self.capped = max_races <= 0  # `max_races` pairs were found: race_count is a lower bound

    def access(self, thread: int, clock: list[int], access: Access, write: bool, uid: int) -> None:
        """Record one access by the event with vector clock `clock` on `thread`, reporting races."""
        if access.empty or self.capped:
            return
        footprint = access.footprint
        if footprint is None or footprint.detector is not self:  # new, dropped, or another run's
            region = self.regions.get(access.region)
            if region is None:
                bucket_bytes = _HBM_BUCKET if access.memory == HBM else _ONCHIP_BUCKET
                region = self.regions[access.region] = _Region(bucket_bytes)
            footprint = access.footprint = region.footprint(access, self)
        # Another thread's latest conflicting entry on an overlapping footprint that is unordered
        # with this access means races: then each is found and reported.
        for other, shared in footprint.overlapping.items():
            if shared is False:
                continue
            unordered = False
            for t, log in other.writes.items():
                if log.clocks[-1] > clock[t] and t != thread:
                    unordered = True
                    break
            if write and not unordered:
                for t, log in other.reads.items():
                    if log.clocks[-1] > clock[t] and t != thread:
                        unordered = True
                        break
            if unordered and (shared or _share_bytes(footprint, other)):
                self._report(thread, clock, access, write, uid, footprint)
                break
        logs = footprint.writes if write else footprint.reads
        log = logs.get(thread)
        if log is None:
            log = logs[thread] = _Log()
        log.clocks.append(clock[thread])
        log.uids.append(uid)
        log.seqs.append(self._seq)
        self._seq += 1
        self._size += 1
        if self._size >= self._compact_at:
            self._prune()

    def _report(
        self, thread: int, clock: list[int], access: Access, write: bool, uid: int, footprint: _Footprint
    ) -> None:
        """Report every unordered conflicting entry of the overlapping footprints, oldest first."""
        found = []
        for other, shared in footprint.overlapping.items():
            if not (shared or shared is None and _share_bytes(footprint, other)):
                continue
            for prior_write, logs in ((True, other.writes), (False, other.reads)):
                if not (write or prior_write):
                    continue
                for t, log in logs.items():
                    if t == thread:
                        continue
                    for i in range(bisect.bisect_right(log.clocks, clock[t]), len(log.clocks)):
                        found.append((log.seqs[i], log.uids[i], t, prior_write, other))
        found.sort(key=lambda entry: entry[0])
        for _, prior_uid, prior_thread, prior_write, other in found:
            pair = (min(prior_uid, uid), max(prior_uid, uid))
            if prior_uid == uid or pair in self._reported:
                continue
            self._reported.add(pair)
            self.race_count += 1
            self.capped = self.race_count >= self.max_races
            if self.capped:
                break
            if len(self.races) < self.max_races:
                self.races.append(
                    Race(
                        first=self.label(prior_uid, prior_thread),
                        second=self.label(uid, thread),
                        memory=other.access.describe_overlap(access),
                        first_access="write" if prior_write else "read",
                        second_access="write" if write else "read",
                    )
                )

    def _prune(self) -> None:
        """Drop entries that happen before every future event, and footprints left empty."""
        frontier = self.frontier()
        bound = None if frontier is None else frontier.tolist()
        for region in self.regions.values():
            for footprint in list(region.by_key.values()):
                for logs in (footprint.reads, footprint.writes):
                    for t in list(logs):
                        log = logs[t]
                        if bound is None:
                            self._size -= len(log.clocks)
                            del logs[t]
                        else:
                            self._size -= log.drop_through(bound[t])
                            if not log.clocks:
                                del logs[t]
                if not footprint.reads and not footprint.writes:
                    region.drop(footprint)
        self._compact_at = max(4096, 2 * self._size)
