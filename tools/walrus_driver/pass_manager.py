"""The pass manager: parse a pipeline text, run its passes in order over one PassContext.

A pipeline is text: pass names separated by commas, each optionally followed by options in
braces, e.g. "anti_dependency_analyzer,pre_sched{pressure_fraction=0.5},allocation". Every name
and option is checked before any pass runs. Instruments (MLIR-style): print the IR after chosen
passes, time each pass, run the verifier after every pass, and collect every pass's counters.
Run as the stage tool (`Instruments.as_tool`), the manager also logs one line per pass start to
stderr (tools/common/passlog.py: what `ncc triage` reads to name the pass that was running) and
honours pass-level fault injection (`NCC_FAULT_INJECT=walrus_driver:segv@pass=NAME@op=PATTERN`),
planted miscompiles included (`walrus_driver:max_to_add@pass=NAME`: miscompile.py, after the pass).
"""

from __future__ import annotations

import resource
import sys
import time
from dataclasses import dataclass, field
from functools import partial
from typing import Any, TextIO

from ncc.tools.common.errors import CompileError
from ncc.tools.common.faults import inject_pass_fault, planted_miscompiles
from ncc.tools.common.passlog import log_pass_start
from ncc.tools.common.pipeline_text import split_pipeline
from ncc.tools.walrus_driver import miscompile, op_patterns, printer
from ncc.tools.walrus_driver.context import PassContext
from ncc.tools.walrus_driver.registry import PassInfo, get_pass

DEFAULT_PASSES = [
    "split_dma",
    "anti_dependency_analyzer",
    "dep_reduction",
    "assign_hwdge_engine",
    "pre_sched",
    "allocation",
    "anti_dependency_analyzer",
    "alloc_semaphores",
    "sync_dve_pool",
    "semaphore_reset",
    "lower_sync",
    "birverifier",
    "codegen",
    "roll_loops",
]

# What each --optlevel runs (every level reports the schedule's lower bound through codegen):
#   0  no reordering: the frontend's order, allocated and synchronized as it is
#   1  scheduling: dep_reduction and the list scheduler, each tile DMA on one queue
#   2  the default: 1 + split_dma (large tile DMAs spread over several queues)
#   3  more effort: 2 with the scheduler trying several pressure settings and a wider
#      ready window, keeping the schedule of least estimated makespan, and scheduling again
#      after allocation (post_sched)
_LEVEL_DROPS = {0: {"split_dma", "dep_reduction", "pre_sched"}, 1: {"split_dma"}, 2: set(), 3: set()}
_LEVEL_INSERTS = {3: {"alloc_semaphores": ["post_sched"]}}  # passes a level adds, before the named one
_LEVEL_OPTIONS = {3: {"pre_sched": "pre_sched{tries=4,pressure_window=128}"}}


def default_pipeline(optlevel: int = 2) -> list[str]:
    """The pass list used when --walrus-passes is not given."""
    if not 0 <= optlevel <= 3:
        raise CompileError("E400", f"--optlevel must be 0..3, got {optlevel}")
    options, inserts = _LEVEL_OPTIONS.get(optlevel, {}), _LEVEL_INSERTS.get(optlevel, {})
    pipeline: list[str] = []
    for name in DEFAULT_PASSES:
        if name not in _LEVEL_DROPS[optlevel]:
            pipeline += inserts.get(name, [])
            pipeline.append(options.get(name, name))
    return pipeline


@dataclass(frozen=True)
class PassSpec:
    name: str
    options: dict[str, str] = field(default_factory=dict)

    def text(self) -> str:
        if not self.options:
            return self.name
        return self.name + "{" + ",".join(f"{k}={v}" for k, v in self.options.items()) + "}"


def parse_pipeline(text: str) -> list[PassSpec]:
    """'a,b{k=v,k2=v2},c' -> [PassSpec('a'), PassSpec('b', {...}), PassSpec('c')]."""
    specs: list[PassSpec] = []
    try:
        items = split_pipeline(text)
    except ValueError as err:
        raise CompileError("E400", f"{err} in pass pipeline {text!r}") from None
    for item in items:
        if not item:
            continue
        name, brace, rest = item.partition("{")
        options: dict[str, str] = {}
        if brace:
            if not rest.endswith("}"):
                raise CompileError("E400", f"malformed pass options in {item!r}")
            for pair in filter(None, (p.strip() for p in rest[:-1].split(","))):
                key, eq, value = pair.partition("=")
                if not eq:
                    raise CompileError("E400", f"pass option {pair!r} in {item!r} is not key=value")
                options[key.strip()] = value.strip()
        specs.append(PassSpec(name.strip(), options))
    return specs


@dataclass
class Instruments:
    print_ir_after: set[str] = field(default_factory=set)  # pass names, or {"all"}
    timing: bool = False
    verify_each: bool = False
    stream: TextIO = field(default_factory=lambda: sys.stderr)
    as_tool: str = ""  # running as this stage tool: log pass starts, honour pass-level fault injection


@dataclass
class PassRecord:
    label: str
    name: str
    wall_s: float
    options: dict[str, str]
    peak_rss_bytes: int = 0  # the process's peak resident memory when the pass ended


def _peak_rss_bytes() -> int:
    """The process's peak resident set so far (Linux reports KiB; macOS bytes)."""
    peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    return peak if sys.platform == "darwin" else peak * 1024


class PassManager:
    """Runs a validated pass list over a PassContext, with the chosen instruments."""

    def __init__(self, pipeline: list[PassSpec] | list[str] | str, instruments: Instruments | None = None):
        if isinstance(pipeline, str):
            pipeline = parse_pipeline(pipeline)
        # A list of texts may carry options too ("pre_sched{tries=4}"): each item is parsed.
        self.specs = [
            spec if isinstance(spec, PassSpec) else parsed
            for spec in pipeline
            for parsed in ([spec] if isinstance(spec, PassSpec) else parse_pipeline(spec))
        ]
        self.instruments = instruments or Instruments()
        # Validate every name and option before anything runs.
        self.plan: list[tuple[PassSpec, PassInfo, Any]] = []
        for spec in self.specs:
            info = get_pass(spec.name)
            self.plan.append((spec, info, info.make_options(spec.options)))
        for name in self.instruments.print_ir_after - {"all"}:
            get_pass(name)
        self.records: list[PassRecord] = []
        self.verify_wall_s = 0.0

    def pipeline_text(self) -> str:
        return ",".join(spec.text() for spec in self.specs)

    def run(self, ctx: PassContext) -> None:
        seen: dict[str, int] = {}
        tool = self.instruments.as_tool
        for position, (spec, info, options) in enumerate(self.plan, 1):
            seen[info.name] = seen.get(info.name, 0) + 1
            label = info.name if seen[info.name] == 1 else f"{info.name}#{seen[info.name]}"
            if tool:
                log_pass_start(self.instruments.stream, tool, label, position, len(self.plan))
                inject_pass_fault(tool, info.name, label, partial(op_patterns.holds, ctx.program))
            ctx.current_pass, ctx.current_label, ctx.options = info.name, label, options
            ctx.stats.setdefault(label, {})
            begin = time.perf_counter()
            try:
                info.run(ctx)
            except CompileError as err:
                if not err.location:
                    err.location = label
                raise
            wall = time.perf_counter() - begin
            self.records.append(PassRecord(label, info.name, wall, dict(spec.options), _peak_rss_bytes()))
            ctx.current_pass = ctx.current_label = ""
            ctx.options = None
            if tool:
                self._plant_miscompiles(ctx, tool, info.name, label)
            if self.instruments.verify_each and info.name != "birverifier":
                self._verify(ctx, after=label)
            wanted = self.instruments.print_ir_after
            if "all" in wanted or info.name in wanted:
                self.instruments.stream.write(f"// ----- IR after {label} -----\n")
                self.instruments.stream.write(printer.format_program(ctx.program))
        ctx.restore_loops()
        if self.instruments.timing:
            self.instruments.stream.write(self.timing_report())

    def _plant_miscompiles(self, ctx: PassContext, tool: str, name: str, label: str) -> None:
        """Test-only: make this pass's output wrong as NCC_FAULT_INJECT asks, and say how."""
        for kind in planted_miscompiles(tool, name, label, partial(op_patterns.holds, ctx.program)):
            change = miscompile.plant(ctx.program, kind) or "nothing to change"
            self.instruments.stream.write(f"{tool}: fault injected after pass {label}: {kind}: {change}\n")
            self.instruments.stream.flush()

    def _verify(self, ctx: PassContext, after: str) -> None:
        verifier = get_pass("birverifier")
        ctx.current_pass, ctx.current_label = "birverifier", f"verify-each after {after}"
        ctx.options = verifier.make_options({})
        begin = time.perf_counter()
        try:
            verifier.run(ctx)
        except CompileError as err:
            raise CompileError(
                err.code, f"{err.message} (--verify-each, after pass {after})", after
            ) from None
        finally:
            self.verify_wall_s += time.perf_counter() - begin
            ctx.stats.pop(ctx.current_label, None)
            ctx.current_pass = ctx.current_label = ""
            ctx.options = None

    def timing_report(self) -> str:
        total = sum(r.wall_s for r in self.records) + self.verify_wall_s
        lines = ["===-- walrus pass timing report --===", f"  total {total * 1e3:10.2f} ms"]
        for record in self.records:
            share = 100.0 * record.wall_s / total if total else 0.0
            lines.append(f"  {record.wall_s * 1e3:10.2f} ms {share:5.1f}%  {record.label}")
        if self.verify_wall_s:
            lines.append(f"  {self.verify_wall_s * 1e3:10.2f} ms          (verify-each)")
        return "\n".join(lines) + "\n"

    def report(self, ctx: PassContext) -> dict[str, Any]:
        """Every pass's counters and wall time (the --stats JSON)."""
        return {
            "tool": "walrus_driver",
            "target": ctx.target.name,
            "pipeline": self.pipeline_text(),
            "total_wall_s": sum(r.wall_s for r in self.records) + self.verify_wall_s,
            "verify_each_wall_s": self.verify_wall_s,
            "passes": [
                {
                    "label": r.label,
                    "name": r.name,
                    "options": r.options,
                    "wall_s": r.wall_s,
                    "peak_rss_bytes": r.peak_rss_bytes,
                    "stats": ctx.stats.get(r.label, {}),
                }
                for r in self.records
            ],
        }
