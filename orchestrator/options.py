"""CompileOptions: what one `ncc compile` was asked to do, typed and serializable.

The parent process parses the command line into this, validates it, and hands it to the compile
child as JSON. `canonical_flags()` is the part that defines the result (the pipeline record and
the cache keys use it); limits and verbosity change how a compile is run, not what it produces.
"""

from __future__ import annotations

import json
from dataclasses import asdict, dataclass, field
from pathlib import Path

DEFAULT_OPTLEVEL = 2
OPTLEVELS = (0, 1, 2, 3)
WORKDIR_SUFFIX = ".ncc-work"


def default_workdir(output: Path) -> Path:
    """`<output dir>/<output stem>.ncc-work`, e.g. model.neff → model.ncc-work beside it."""
    return output.parent / f"{output.stem}{WORKDIR_SUFFIX}"


LOOP_MODES = ("auto", "rolled", "unrolled")
DEFAULT_LOOPS = "auto"  # the Frontend's --loops


@dataclass(frozen=True)
class CompileOptions:
    model: Path
    output: Path
    workdir: Path
    optlevel: int = DEFAULT_OPTLEVEL
    verify: bool = False
    verify_inputs: Path | None = None  # --verify's inputs (arg0..argN of an .npz) instead of seeded ones
    walrus_passes: tuple[str, ...] = field(default_factory=tuple)
    penguin_passes: tuple[str, ...] = field(default_factory=tuple)  # () = the optlevel's default
    num_stages: int = 0  # software-pipeline every eligible loop in this many stages (0: annotated only)
    loops: str = DEFAULT_LOOPS  # "rolled": loops that can stay loops do; "unrolled": every loop unrolls
    timeout_s: float | None = None  # per job
    mem_limit_mb: int | None = None  # per job, resident memory of the tool's process tree
    verbose: int = 1
    cache_dir: Path | None = None  # the stage cache shared across work dirs (None: no cache)

    def canonical_flags(self) -> list[str]:
        """The flags that define the compile's result, in a fixed spelling and order."""
        flags = [f"--optlevel={self.optlevel}"]
        if self.verify:
            flags.append("--verify")
        if self.verify_inputs:  # the file's digest, not its name, is in the GoldenEvaluator's record
            flags.append("--verify-inputs")
        if self.walrus_passes:
            flags.append(f"--walrus-passes={','.join(self.walrus_passes)}")
        if self.penguin_passes:
            flags.append(f"--penguin-passes={','.join(self.penguin_passes)}")
        if self.num_stages:
            flags.append(f"--num-stages={self.num_stages}")
        if self.loops != DEFAULT_LOOPS:
            flags.append(f"--loops={self.loops}")
        return flags

    def to_json(self) -> str:
        data = asdict(self)
        for key in ("model", "output", "workdir", "cache_dir", "verify_inputs"):
            data[key] = None if data[key] is None else str(data[key])
        data["walrus_passes"] = list(self.walrus_passes)
        data["penguin_passes"] = list(self.penguin_passes)
        return json.dumps(data, sort_keys=True)

    @classmethod
    def from_json(cls, text: str) -> CompileOptions:
        data = json.loads(text)
        return cls(
            model=Path(data["model"]),
            output=Path(data["output"]),
            workdir=Path(data["workdir"]),
            optlevel=int(data["optlevel"]),
            verify=bool(data["verify"]),
            verify_inputs=Path(data["verify_inputs"]) if data.get("verify_inputs") else None,
            walrus_passes=tuple(data["walrus_passes"]),
            penguin_passes=tuple(data.get("penguin_passes", ())),
            num_stages=int(data.get("num_stages", 0)),
            loops=str(data.get("loops", DEFAULT_LOOPS)),
            timeout_s=data["timeout_s"],
            mem_limit_mb=data["mem_limit_mb"],
            verbose=int(data["verbose"]),
            cache_dir=Path(data["cache_dir"]) if data.get("cache_dir") else None,
        )
