"""PassContext: the program being compiled, the target, the dependence graph and the pipeline state.

Passes talk to each other only through this object. The state flags say which analyses are
current, so a pass whose prerequisite is missing or stale stops with E402 instead of doing
something wrong:

  deps_valid                the dependence graph holds every memory conflict of the program, and
                            program.instructions is one topological order of it
  deps_valid_for_addresses  ... and it was computed with the buffers' final addresses (address
                            reuse by `allocation` adds hazards between different buffers)
  deps_reduced              the graph is transitively reduced (still orders the same pairs)
  allocated                 every SBUF/PSUM buffer has an address
  queues_assigned           dma queues and trigger engines were chosen
  synchronized              semaphore waits/updates were inserted for the current order
  codegen_done              program.streams hold the per-engine streams
  sync_lowered              (program attribute) lower_sync encoded every wait's threshold
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from ncc.schemas import bir_pb2
from ncc.tools.common.errors import CompileError
from ncc.tools.target import Target
from ncc.tools.walrus_driver.analysis import birutil, loopnest
from ncc.tools.walrus_driver.analysis.costs import CostTable
from ncc.tools.walrus_driver.analysis.depgraph import DepGraph

# Program attribute set by lower_sync: every wait carries its encoded words, so no pass may add one.
SYNC_LOWERED = "walrus.sync_lowered"

# Edge kinds of the dependence graph (edge attribute "kind"); when a pair conflicts in several
# ways the strongest kind is kept: FLOW > OUTPUT > ANTI > ORDERED (depgraph.KINDS).
FLOW, ANTI, OUTPUT, ORDERED = "FLOW", "ANTI", "OUTPUT", "ORDERED"


@dataclass
class PassContext:
    program: bir_pb2.Program
    target: Target
    deps: DepGraph | None = None
    deps_valid: bool = False
    deps_valid_for_addresses: bool = False
    deps_reduced: bool = False
    allocated: bool = False
    scheduled: bool = False
    queues_assigned: bool = False
    synchronized: bool = False
    # every wait that could hold the DVE/POOL SBUF port against the other engine rides on a drain
    # (sync_dve_pool); a program received already synchronized is taken as finished
    ports_synchronized: bool = False
    codegen_done: bool = False
    stats: dict[str, dict[str, float]] = field(default_factory=dict)
    # The program as received, serialized (bir_sim's reference, the crash reproducer): bytes are
    # a tenth of the parsed copy's memory at a million instructions; `input_program` parses them.
    input_bytes: bytes | None = None
    current_pass: str = ""
    current_label: str = ""
    options: Any = None
    order_before_schedule: list[int] | None = None  # instruction ids in the order pre_sched received
    # dmas pre_sched moved to another trigger engine, as they were: going back to the order above
    # puts them back too (a store waiting for its data on SP would hold up the loads behind it).
    triggers_before_schedule: dict[int, Any] | None = None
    queue_pools: dict[int, list[int]] | None = None  # trigger engine -> its DMA queues (assign_hwdge_engine)
    # dmas that need no semaphore and so may take any queue, whatever their engine's pool (same)
    unpooled_dmas: set[int] = field(default_factory=set)
    _cost_table: CostTable | None = None
    # instruction id -> its footprints relative to its buffers (anti_dependency_analyzer's memo)
    footprint_cache: dict[int, Any] = field(default_factory=dict)
    hbm_widths: dict[str, int] | None = None  # the row view of each HBM tensor the cached footprints use
    # the analyzer's HBM edges, which neither addresses nor a dependence-respecting reorder
    # change: kept for its next run for as long as the instructions stay as they are
    hbm_edges: Any = None
    # How to rebuild a graph made stale by a pass that changed instructions, run only when a later
    # pass asks for it (require_deps) before the analyzer runs again (allocation's spills)
    deps_rebuild: Callable[[], None] | None = None
    # alloc_semaphores' vector clocks over the final order (syncmodel.ClockWalk), for the passes
    # right after it (semaphore_reset); dropped as soon as the order or the instructions change
    sync_walk: Any = None
    # codegen's lower bound (costs.lower_bound_ns) of the synchronized program, which
    # alloc_semaphores starts on the spare core (tools/common/forked.py) as it fixes the order:
    # the passes after it add only waits, nops, drains and the reset, which the bound leaves out.
    # A forked.Forked; dropped (its child stopped) when instructions change
    final_bound: Any = None
    # Programs whose global order keeps loops (analysis/loopnest.py): the dependences each loop
    # carries from one iteration to a later one (loop_deps.Carried), beside the DAG in `deps`
    carried: list[Any] = field(default_factory=list)
    # ... and its loop entries, by id, kept out of program.instructions while the passes run
    # (loopnest.extract / restore): every pass sees the static program, one iteration of each body
    loop_entries: dict[int, bir_pb2.Instruction] = field(default_factory=dict)

    def costs(self) -> CostTable:
        """The shared memo of instruction costs, reset when instructions change."""
        if self._cost_table is None:
            self._cost_table = CostTable(self.target)
        return self._cost_table

    @classmethod
    def for_program(cls, program: bir_pb2.Program, target: Target) -> PassContext:
        """A context whose flags describe what the incoming program already has."""
        input_bytes = program.SerializeToString()
        entries = loopnest.extract(program)
        onchip = [b for b in program.buffers if b.memory in birutil.ONCHIP]
        synced = program.num_semaphores > 0 or any(i.waits or i.updates for i in program.instructions)
        return cls(
            program=program,
            target=target,
            loop_entries=entries,
            input_bytes=input_bytes,
            allocated=all(b.address >= 0 for b in onchip),
            synchronized=synced,
            ports_synchronized=synced,
            codegen_done=len(program.streams) > 0,
        )

    def loops(self) -> loopnest.LoopNest:
        """The loop structure of the static program (empty when it keeps no loops)."""
        return loopnest.LoopNest.of(self.loop_entries, self.program.instructions)

    def restore_loops(self) -> None:
        """Put the loop entries back into program.instructions (before the program is written)."""
        loopnest.restore(self.program.instructions, self.loop_entries)

    @property
    def input_program(self) -> bir_pb2.Program | None:
        """A fresh copy of the program as received (None if it was not kept)."""
        if self.input_bytes is None:
            return None
        return bir_pb2.Program.FromString(self.input_bytes)

    # ---- statistics -------------------------------------------------------------------------
    def _counters(self) -> dict[str, float]:
        return self.stats.setdefault(self.current_label or self.current_pass or "driver", {})

    def count(self, name: str, value: float = 1) -> None:
        """Add `value` to the running pass's counter `name`."""
        counters = self._counters()
        counters[name] = counters.get(name, 0) + value

    def set_stat(self, name: str, value: float) -> None:
        self._counters()[name] = value

    # ---- prerequisites ----------------------------------------------------------------------
    def fail_needs(self, what: str) -> None:
        raise CompileError(
            "E402", f"pass {self.current_pass} needs {what} to run before it", self.current_pass
        )

    def fail_needs_before(self, what: str) -> None:
        raise CompileError("E402", f"pass {self.current_pass} must run before {what}", self.current_pass)

    def valid_deps(self) -> DepGraph | None:
        """The dependence graph if it is valid (a stale one rebuilt if it can be), else None."""
        if (self.deps is None or not self.deps_valid) and self.deps_rebuild is not None:
            rebuild, self.deps_rebuild = self.deps_rebuild, None
            rebuild()
        return self.deps if self.deps_valid else None

    def require_deps(self, for_addresses: bool = False) -> DepGraph:
        """The dependence graph, or E402 if it is missing or stale."""
        if self.valid_deps() is None:
            self.fail_needs("anti_dependency_analyzer")
        if for_addresses and not self.deps_valid_for_addresses:
            self.fail_needs("anti_dependency_analyzer (after allocation: address reuse adds hazards)")
        assert self.deps is not None
        return self.deps

    def require_allocated(self) -> None:
        if not self.allocated:
            self.fail_needs("allocation")

    def require_synchronized(self) -> None:
        if not self.synchronized:
            self.fail_needs("alloc_semaphores")

    def forbid_after_sync(self) -> None:
        """Passes that change order, addresses or threads would invalidate inserted semaphores."""
        if self.synchronized:
            raise CompileError(
                "E402",
                f"pass {self.current_pass} must run before alloc_semaphores: it would invalidate the "
                "semaphores already inserted",
                self.current_pass,
            )

    @property
    def sync_lowered(self) -> bool:
        return self.program.attributes.get(SYNC_LOWERED) == "1"

    def forbid_after_lower_sync(self) -> None:
        """Passes that add or change waits must run before lower_sync encodes them."""
        if self.sync_lowered:
            raise CompileError(
                "E402",
                f"pass {self.current_pass} must run before lower_sync: the waits it adds would not be "
                "encoded",
                self.current_pass,
            )

    # ---- invalidation -----------------------------------------------------------------------
    def addresses_changed(self) -> None:
        self.deps_valid_for_addresses = False
        self.codegen_done = False

    def instructions_changed(self) -> None:
        """Instructions were added or removed: the dependence graph and the schedule are stale."""
        self.deps = None
        self.deps_rebuild = None
        self._cost_table = None
        self.footprint_cache = {}
        self.hbm_widths = None
        self.hbm_edges = None
        self.order_before_schedule = self.triggers_before_schedule = None
        self.deps_valid = self.deps_valid_for_addresses = self.deps_reduced = False
        self.carried = []
        self.scheduled = False
        self.codegen_done = False
        self.sync_walk = None
        if self.final_bound is not None:
            self.final_bound.cancel()
            self.final_bound = None

    def order_changed(self) -> None:
        self.codegen_done = False
        self.sync_walk = None
