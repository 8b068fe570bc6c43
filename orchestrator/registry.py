"""JobRegistry: job name (as it appears in a pipeline) → the Luigi task class that runs it.

A pipeline is data — a flat list of job names from `CompileCommand.buildPipeline()` — and this
registry is the one place that turns a name into code. The stage classes register themselves in
`ncc.orchestrator.stages`, imported on first use so that importing the registry stays cheap.
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, TypeVar

if TYPE_CHECKING:
    from ncc.orchestrator.job import ToolJob

J = TypeVar("J", bound="type[ToolJob]")

_STAGES_MODULE = "ncc.orchestrator.stages"


class JobRegistry:
    _jobs: dict[str, type[ToolJob]] = {}

    @classmethod
    def register(cls, job_class: J) -> J:
        """Class decorator: make `job_class` available under its class name."""
        name = job_class.__name__
        if name in cls._jobs and cls._jobs[name] is not job_class:
            raise ValueError(f"job {name} registered twice")
        cls._jobs[name] = job_class
        return job_class

    @classmethod
    def get(cls, name: str) -> type[ToolJob]:
        importlib.import_module(_STAGES_MODULE)
        try:
            return cls._jobs[name]
        except KeyError:
            raise KeyError(f"no job named {name!r}; known jobs: {', '.join(sorted(cls._jobs))}") from None

    @classmethod
    def names(cls) -> list[str]:
        importlib.import_module(_STAGES_MODULE)
        return sorted(cls._jobs)
