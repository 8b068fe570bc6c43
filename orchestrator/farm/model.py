"""What a farm compiles: the input lines it was given and the distinct models they name."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from ncc.orchestrator.options import CompileOptions
from ncc.orchestrator.pipeline.compile_command import CompileCommand


@dataclass(frozen=True)
class FarmInput:
    """One line of the farm's input list: a model file and its own compile flags."""

    path: Path
    flags: tuple[str, ...] = ()



@dataclass
class FarmModel:
    """A (model content, flags) pair to compile, and every input line that asked for it."""

    inputs: list[FarmInput]
    options: CompileOptions
    command: CompileCommand
    jobs: list[str]
    neff_name: str = ""  # under the farm's neff/: the model's name, made unique by its work dir if needed
    restored: bool = False  # finished by restore_without_tools: verified and installed already

    @property
    def workdir(self) -> Path:
        return self.options.workdir

    @property
    def input_bytes(self) -> int:
        """The model's size: its jobs' Luigi priority, so the largest models start first and a
        small one, not a large one, is what still runs when the other workers have run out."""
        return self.options.model.stat().st_size
