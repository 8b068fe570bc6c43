"""Semaphore counts in a program that keeps loops: from the static order to every iteration.

alloc_semaphores gives each producing thread one semaphore and each waited-on producer a +1
update, so a thread's count after one of its producers is that producer's rank among the
thread's waited-on producers in execution order. In a program with loops a producer inside a
loop runs at every iteration, and its count grows with them (analysis/loopnest.py):

  count(P at iterations r_1..r_k of its loops L_1..L_k)
      = base(P) + sum_j r_j * U(thread, L_j)

where U(thread, L) is what one iteration of L adds to the thread's count (its waited-on
producers directly in L's body, plus trip x U of each loop inside L), and base(P) is P's count
at iteration 0 of each of its loops, loops that end before it counted whole. `LoopCounts` walks
the static order once to get both, and turns each wait into a threshold with `loop_steps`:

  * a dependence within one iteration (the DAG's edges): the consumer at iterations r of the
    loops it shares with P waits for P at the same iterations, and for P's last iteration of
    the loops it does not share (a loop before the consumer is over when the consumer runs);
  * a dependence a loop L carries at distance d (loop_deps.Carried): the consumer at iteration
    r of L waits for P at r - d, its inner loops at their last iteration. Early iterations get a
    threshold below what the thread reached before the loop (negative, even): the wait holds at
    once, as it should, since there is no iteration r - d (docs/ir.md: a threshold below 0 in a
    loop is 0).
"""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Callable, Hashable, Iterable

from ncc.schemas import bir_pb2
from ncc.tools.walrus_driver.analysis.loopnest import LoopNest


class LoopCounts:
    """Per waited-on producer its base count and per (thread, loop) the count one iteration adds."""

    def __init__(self, nest: LoopNest, order: Iterable[bir_pb2.Instruction], waited: set[int],
                 thread_of: Callable[[bir_pb2.Instruction], Hashable]) -> None:
        self.nest = nest
        order = list(order)
        self.thread: dict[int, Hashable] = {}
        direct: dict[tuple[Hashable, int], int] = defaultdict(int)  # (thread, loop) -> producers in it
        for instr in order:
            if instr.id in waited:
                thread = self.thread[instr.id] = thread_of(instr)
                owner = nest.owner(instr.id)
                if owner in nest.loops:
                    direct[(thread, owner)] += 1
        # per iteration of each loop: its own producers plus every iteration of the loops in it
        self.per_iteration: dict[tuple[Hashable, int], int] = defaultdict(int)
        threads = set(self.thread.values())
        for loop in sorted(nest.loops.values(), key=lambda loop: -loop.depth):
            for thread in threads:
                count = direct.get((thread, loop.id), 0) + self.per_iteration.get((thread, loop.id), 0)
                if not count:
                    continue
                self.per_iteration[(thread, loop.id)] = count
                if loop.parent in nest.loops:
                    self.per_iteration[(thread, loop.parent)] += loop.trip * count
        self.base: dict[int, int] = {}
        count: dict[Hashable, int] = defaultdict(int)
        open_chain: tuple[int, ...] = ()
        for instr in order:
            chain = nest.chain_of(instr.id)
            shared = len(nest.common(chain[-1], open_chain[-1])) if chain and open_chain else 0
            for loop_id in reversed(open_chain[shared:]):  # loops that ended: the rest of their iterations
                self._close(count, loop_id, threads)
            open_chain = chain
            if instr.id in waited:
                thread = self.thread[instr.id]
                count[thread] += 1
                self.base[instr.id] = count[thread]
        for loop_id in reversed(open_chain):
            self._close(count, loop_id, threads)
        self.final = dict(count)  # each thread's count when the program ends

    def _close(self, count: dict[Hashable, int], loop_id: int, threads: set[Hashable]) -> None:
        trip = self.nest.loops[loop_id].trip
        for thread in threads:
            step = self.per_iteration.get((thread, loop_id), 0)
            if step:
                count[thread] += (trip - 1) * step

    def threshold(self, producer: int, consumer: int, carried_loop: int | None = None,
                  distance: int = 0, producer_loop: int | None = None,
                  scale: int = 1) -> tuple[int, list[int]]:
        """(value, loop_steps) of the consumer's wait for `producer` (ids): within an iteration, or
        `distance` iterations earlier of `carried_loop`, or (`producer_loop`, an earlier loop
        beside `carried_loop`) at that loop's iteration scale * r - distance when the consumer is
        at iteration r of `carried_loop`. loop_steps has one entry per loop of the consumer, or none when the
        threshold does not move."""
        nest = self.nest
        thread = self.thread[producer]
        producer_chain, consumer_chain = nest.chain_of(producer), nest.chain_of(consumer)
        if producer_loop is not None and carried_loop is not None and producer_loop != carried_loop:
            shared = nest.chain(producer_loop)
            value = self.base[producer] - distance * self.per_iteration.get((thread, producer_loop), 0)
            for loop_id in producer_chain[len(shared):]:
                value += (nest.loops[loop_id].trip - 1) * self.per_iteration.get((thread, loop_id), 0)
            outer = shared[:-1]  # the loops around both
            steps = [self.per_iteration.get((thread, loop_id), 0) if loop_id in outer else 0
                     for loop_id in consumer_chain]
            if carried_loop in consumer_chain:
                per = self.per_iteration.get((thread, producer_loop), 0)
                steps[consumer_chain.index(carried_loop)] = scale * per
            return value, steps if any(steps) else []
        if carried_loop is None:
            shared = ()
            if producer_chain and consumer_chain:
                shared = nest.common(producer_chain[-1], consumer_chain[-1])
        else:
            shared = nest.chain(carried_loop)
        value = self.base[producer]
        for loop_id in producer_chain[len(shared):]:  # the loops it does not share: their last iteration
            value += (nest.loops[loop_id].trip - 1) * self.per_iteration.get((thread, loop_id), 0)
        if carried_loop is not None:
            value -= distance * self.per_iteration.get((thread, carried_loop), 0)
        steps = [self.per_iteration.get((thread, loop_id), 0) if loop_id in shared else 0
                 for loop_id in consumer_chain]
        return value, steps if any(steps) else []
