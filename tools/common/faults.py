"""Test-only fault injection: make a stage tool misbehave for real, as NCC_FAULT_INJECT asks.

    NCC_FAULT_INJECT="TOOL:KIND[@CONDITION...][,TOOL:KIND...]"

KIND is what the tool does, for real:
  abort  SIGABRT (os.abort)                segv   SIGSEGV (a read of address 0)
  kill   SIGKILL to itself                  oom    allocates 64 MiB at a time until killed
  hang   sleeps forever                     exit   exits 3 (an internal error, no traceback)
  raise  raises RuntimeError (exit 3 with a traceback in the tool's stderr)
  slow   sleeps 3 s, then works normally (time for a test to change something mid-compile)
Or a planted miscompile: the tool goes on, but the named pass's output is wrong (after it ran):
  drop_wait   one semaphore wait is removed from one instruction (needs a pass at or after
              alloc_semaphores: before it there are no waits to drop)
  drop_rotation_wait
              a rolled loop body's write into a rotating buffer loses a wait that grows with
              the loop, in every iteration (needs pass=roll_loops)
  max_to_add  one ALU instruction computing `maximum` computes `add` instead
A miscompile needs `pass=NAME` (without one it never happens); the tool's pass manager plants
it (tools/walrus_driver/miscompile.py) and logs what it changed.

Without a condition the tool misbehaves as it starts. Conditions, joined by `@`, all must hold:
  pass=NAME     not at start but when pass NAME starts (a miscompile: when it ends; a pass name,
                or a label such as `anti_dependency_analyzer#2` for its second run); tools with a
                pass manager only
  op=PATTERN    only when the program holds PATTERN, an HLO opcode (`divide`) or a consumer with
                a producer among its operands (`divide(exponential)`: a divide that consumes an
                exponential); checked at pass starts (a miscompile: ends), the tool's pass
                manager says what matches
  TEXT          anything else: TEXT occurs in the tool's command line (one model of a farm)
So `walrus_driver:segv@pass=allocation@op=divide(exponential)` segfaults walrus_driver as its
`allocation` pass starts, in every module where a divide consumes an exponential (F139), and
`walrus_driver:max_to_add@pass=pre_sched` makes pre_sched's output compute an add where a
maximum was (the compile goes on; `--verify` or `ncc bisect` finds it).
Unset, nothing here costs more than reading one environment variable.
"""

from __future__ import annotations

import ctypes
import os
import re
import signal
import sys
import time
from collections.abc import Callable
from dataclasses import dataclass

FAULT_ENV = "NCC_FAULT_INJECT"
EXIT_INTERNAL = 3
KINDS = ("abort", "segv", "kill", "oom", "hang", "exit", "raise", "slow")
MISCOMPILES = ("drop_wait", "drop_rotation_wait", "max_to_add")

_PATTERN = re.compile(r"^([A-Za-z][\w.-]*)(?:\(([A-Za-z][\w.-]*)\))?$")


@dataclass(frozen=True)
class OpPattern:
    """`consumer` computed by an instruction one of whose operands `producer` computed (if given)."""

    consumer: str
    producer: str = ""

    @classmethod
    def parse(cls, text: str) -> OpPattern | None:
        match = _PATTERN.match(text.strip())
        return cls(match.group(1), match.group(2) or "") if match else None

    def text(self) -> str:
        return f"{self.consumer}({self.producer})" if self.producer else self.consumer


@dataclass(frozen=True)
class Fault:
    """One item of NCC_FAULT_INJECT."""

    tool: str
    kind: str
    pass_name: str = ""
    pattern: OpPattern | None = None
    texts: tuple[str, ...] = ()
    malformed: bool = False  # an op= pattern that does not parse: the fault never fires

    @property
    def at_pass(self) -> bool:
        """Fires at a pass boundary rather than as the tool starts."""
        return bool(self.pass_name or self.pattern or self.malformed)

    @property
    def miscompile(self) -> bool:
        """A planted miscompile (the pass's output is changed) rather than a misbehaving process."""
        return self.kind in MISCOMPILES

    @classmethod
    def parse(cls, item: str) -> Fault:
        tool, _, rest = item.partition(":")
        kind, *conditions = rest.split("@")
        pass_name, pattern, texts, malformed = "", None, [], False
        for condition in conditions:
            key, eq, value = condition.partition("=")
            if eq and key == "pass":
                pass_name = value
            elif eq and key == "op":
                pattern = OpPattern.parse(value)
                malformed = malformed or pattern is None
            else:
                texts.append(condition)
        return cls(tool.strip(), kind.strip(), pass_name, pattern, tuple(texts), malformed)


FAULT_TOOLS = ("hlo2penguin", "hlo_opt", "walrus_driver", "packager", "sim", "driver")


def spec_problems(spec: str) -> list[str]:
    """Why items of an NCC_FAULT_INJECT value would never fire as meant (an unknown tool or kind,
    a miscompile without its pass, an empty pass= or a malformed op=): a mistyped fault must not
    look like a passing test."""
    problems = []
    for item in filter(None, (part.strip() for part in spec.split(","))):
        fault = Fault.parse(item)
        conditions = item.split("@")[1:]
        if fault.tool not in FAULT_TOOLS:
            problems.append(f"{item!r} names no tool ncc runs (tools: {', '.join(FAULT_TOOLS)})")
        elif fault.kind not in KINDS + MISCOMPILES:
            kinds = ", ".join(KINDS + MISCOMPILES)
            problems.append(f"{item!r}: no fault kind {fault.kind!r} (kinds: {kinds})")
        elif "pass=" in conditions:
            problems.append(f"{item!r}: pass= names no pass")
        elif fault.malformed:
            problems.append(f"{item!r}: its op= is not an opcode or consumer(producer)")
        elif fault.miscompile and not fault.pass_name:
            problems.append(f"{item!r}: a planted miscompile needs pass=NAME")
    return problems


def faults_for(tool: str) -> list[Fault]:
    """The faults NCC_FAULT_INJECT names for `tool` whose command-line TEXT conditions hold."""
    spec = os.environ.get(FAULT_ENV, "")
    if not spec:
        return []
    command = " ".join(sys.argv)
    found = []
    for item in filter(None, (part.strip() for part in spec.split(","))):
        fault = Fault.parse(item)
        if fault.tool == tool and all(text in command for text in fault.texts):
            found.append(fault)
    return found


def misbehave(kind: str, where: str = "") -> None:
    """Do what fault `kind` says, for real (an unknown kind does nothing)."""
    if kind == "abort":
        os.abort()
    elif kind == "segv":
        ctypes.string_at(0)  # a real SIGSEGV: read address 0
    elif kind == "kill":
        os.kill(os.getpid(), signal.SIGKILL)
    elif kind == "oom":
        hog = []
        while True:
            hog.append(bytearray(64 << 20))  # touch 64 MiB at a time until killed
            time.sleep(0.01)
    elif kind == "hang":
        while True:
            time.sleep(3600)
    elif kind == "exit":
        sys.exit(EXIT_INTERNAL)
    elif kind == "raise":
        raise RuntimeError(f"fault injected ({FAULT_ENV}){' in ' + where if where else ''}")
    elif kind == "slow":
        time.sleep(3)


def inject_fault(tool: str) -> None:
    """As the tool starts: misbehave as NCC_FAULT_INJECT asks, for its faults without pass conditions."""
    for fault in faults_for(tool):
        if not fault.at_pass and not fault.miscompile:
            misbehave(fault.kind, tool)


def _fires_at(fault: Fault, pass_name: str, label: str, holds: Callable[[OpPattern], bool]) -> bool:
    if not fault.at_pass or fault.malformed:
        return False
    if fault.pass_name and fault.pass_name not in (pass_name, label):
        return False
    return fault.pattern is None or holds(fault.pattern)


def inject_pass_fault(
    tool: str, pass_name: str, label: str, holds: Callable[[OpPattern], bool]
) -> None:
    """As pass `pass_name` (its run `label`) starts: misbehave for each fault whose pass and op
    conditions hold; `holds(pattern)` says whether the program being compiled holds a pattern."""
    for fault in faults_for(tool):
        if not fault.miscompile and _fires_at(fault, pass_name, label, holds):
            misbehave(fault.kind, f"pass {label}")


def planted_miscompiles(
    tool: str, pass_name: str, label: str, holds: Callable[[OpPattern], bool]
) -> list[str]:
    """After pass `pass_name` (its run `label`) ran: the miscompile kinds to plant in its output,
    for each miscompile fault naming this pass whose other conditions hold."""
    return [
        fault.kind
        for fault in faults_for(tool)
        if fault.miscompile and fault.pass_name and _fires_at(fault, pass_name, label, holds)
    ]
