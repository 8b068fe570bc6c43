"""Driver settings that are not command-line flags, read in one place.

Everything the driver takes from its environment is read here, once, into a frozen dataclass:
how tools are started (the same Python as the driver, `-m ncc.tools.<pkg>`), how often the
supervisor samples a process tree, and the test-only fault injection for the driver itself
(NCC_FAULT_INJECT="driver:KIND", the same variable and syntax the stage tools honour).
"""

from __future__ import annotations

import os
import sys
from dataclasses import dataclass
from functools import lru_cache

FAULT_ENV = "NCC_FAULT_INJECT"
DRIVER_FAULT_NAME = "driver"

# The variables that can change what a stage tool does, recorded per compile (run_settings.json)
# so that `ncc triage` can replay a job as it ran; no other variable is recorded (no secrets).
REPLAY_ENV = (
    FAULT_ENV,
    "NCC_SIM_MAX_BYTES",  # the simulator's memory budget (tools/sim/limits.py)
    "PYTHONFAULTHANDLER",
    "PYTHONHASHSEED",
    "PYTHONUTF8",
    "PYTHONDONTWRITEBYTECODE",
    "LANG",
    "LC_ALL",
    "LC_CTYPE",
    "OMP_NUM_THREADS",
    "OPENBLAS_NUM_THREADS",
    "MKL_NUM_THREADS",
)

# The math libraries' thread pools. A tool is one Python thread; numpy's BLAS would start a pool of
# one thread per core in every tool process, and those threads spin at start-up (0.12 CPU-s per
# `import numpy` on this machine), so N tools running at once on N cores fight for the cores.
THREAD_POOL_ENV = ("OMP_NUM_THREADS", "OPENBLAS_NUM_THREADS", "MKL_NUM_THREADS")


@dataclass(frozen=True)
class DriverSettings:
    python: str  # the interpreter that runs the tools and the compile child
    tool_package: str  # tools run as `python -m <tool_package>.<tool>`
    poll_interval_s: float  # supervisor sampling period
    tool_env: tuple[tuple[str, str], ...]  # environment of every tool process
    driver_fault: str  # fault to inject into the compile child ("" = none)
    fault_injection: bool  # NCC_FAULT_INJECT is set: tools may misbehave on purpose (no caching)

    def tool_command(self, tool: str) -> list[str]:
        return [self.python, "-m", f"{self.tool_package}.{tool}"]

    def replay_env(self) -> dict[str, str]:
        """The tools' environment restricted to REPLAY_ENV: what a replay of a job must set."""
        return {key: value for key, value in self.tool_env if key in REPLAY_ENV}


def budget_tool_threads(concurrent_jobs: int) -> int:
    """Give each of `concurrent_jobs` tools running at once its share of this machine's cores as
    its math-library thread pool (a farm of N workers: cores // N, at least 1). A pool size the
    user set in the environment is kept. Call before the first `settings()`; returns the share."""
    share = max(1, (os.cpu_count() or 1) // max(1, concurrent_jobs))
    for name in THREAD_POOL_ENV:
        os.environ.setdefault(name, str(share))
    settings.cache_clear()
    return share


def _driver_fault(spec: str) -> str:
    for item in filter(None, spec.split(",")):
        name, _, kind = item.partition(":")
        if name == DRIVER_FAULT_NAME:
            return kind
    return ""


@lru_cache(maxsize=1)
def settings() -> DriverSettings:
    env = dict(os.environ)
    # A tool that crashes prints the Python stack of every thread before dying by the same signal.
    env.setdefault("PYTHONFAULTHANDLER", "1")
    return DriverSettings(
        python=sys.executable,
        tool_package="ncc.tools",
        poll_interval_s=0.02,
        tool_env=tuple(sorted(env.items())),
        driver_fault=_driver_fault(os.environ.get(FAULT_ENV, "")),
        fault_injection=bool(os.environ.get(FAULT_ENV)),
    )
