"""JobRegistry: job name (as it appears in a pipeline) → its JobSpec class.

A pipeline is data — a flat list of job names from `CompileCommand.buildPipeline()` — and this
registry is the one place that turns a name into code. The stage specs register themselves in
`ncc.orchestrator.pipeline.stages`, imported on first use so that importing the registry stays cheap;
the Luigi task class of a stage is made from its spec by `job.task_class_of`, so code that only
needs specs (a compile restored entirely from the cache) never imports Luigi.
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, TypeVar

if TYPE_CHECKING:
    from ncc.orchestrator.pipeline.jobspec import JobSpec

S = TypeVar("S", bound="type[JobSpec]")

_STAGES_MODULE = "ncc.orchestrator.pipeline.stages"


class JobRegistry:
    _specs: dict[str, type[JobSpec]] = {}

    @classmethod
    def register(cls, spec_class: S) -> S:
        """Class decorator: make the stage `spec_class` available under its class name."""
        name = spec_class.__name__
        if name in cls._specs and cls._specs[name] is not spec_class:
            raise ValueError(f"job {name} registered twice")
        cls._specs[name] = spec_class
        return spec_class

    @classmethod
    def spec(cls, name: str) -> type[JobSpec]:
        importlib.import_module(_STAGES_MODULE)
        try:
            return cls._specs[name]
        except KeyError:
            raise KeyError(f"no job named {name!r}; known jobs: {', '.join(sorted(cls._specs))}") from None

    @classmethod
    def names(cls) -> list[str]:
        importlib.import_module(_STAGES_MODULE)
        return sorted(cls._specs)
