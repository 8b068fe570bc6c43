"""The jobs of a compile, one per stage tool, in the order the descent runs them.

Each class says which tool it forks, which files it reads (the model or an earlier job's
outputs), which files it writes into its own folder, and its flags. Everything else — folders,
records, completeness, the cache — is JobSpec's, and running the tool under Luigi is ToolJob's.
Nothing here imports Luigi.

    F0 HLOToTensorizer  hlo2penguin            model        → penguin.pb, module.pb
    F1 GoldenEvaluator  hlo_opt --evaluate     module.pb    → golden.pb          (--verify)
    F2 Frontend         hlo_opt                penguin.pb   → bir.pb
       WalrusDriver     walrus_driver          bir.pb       → program.pb, stats.json
       Packager         packager               program.pb   → model.neff
       NeffVerifier     sim                    model.neff, golden.pb → sim_report.json, sim_out.pb  (--verify)
"""

from __future__ import annotations

from pathlib import Path

from ncc.orchestrator import digests
from ncc.orchestrator.options import DEFAULT_LOOPS
from ncc.orchestrator.pipeline.jobspec import JobSpec
from ncc.orchestrator.pipeline.registry import JobRegistry
from ncc.orchestrator.versions import ncc_version

GOLDEN_SEED = 0
NEFF_NAME = "model.neff"


@JobRegistry.register
class HLOToTensorizer(JobSpec):
    """F0: read and verify the HLO module, legalize it and lower it to Penguin IR."""

    tool = "hlo2penguin"
    output_names = ("penguin.pb", "module.pb")

    def input_paths(self) -> list[Path]:
        return [Path(self.model)]

    def flags(self) -> list[str]:
        # nothing in lowering depends on --optlevel yet; --loops decides where the size is checked
        return ["--loops", self.loops] if self.loops != DEFAULT_LOOPS else []

    def tool_arguments(self) -> list[str]:
        penguin, module = self.output_paths()
        return [
            "--input",
            self.model,
            "--output",
            self.rel(penguin),
            "--module-output",
            self.rel(module),
            *self.flags(),
        ]


@JobRegistry.register
class GoldenEvaluator(JobSpec):
    """F1: evaluate the HLO module on seeded inputs (or the user's, --verify-inputs): the reference
    outputs NeffVerifier checks."""

    tool = "hlo_opt"
    output_names = ("golden.pb",)

    def input_paths(self) -> list[Path]:
        given = [Path(self.verify_inputs)] if self.verify_inputs else []
        return [self.artifact("HLOToTensorizer", "module.pb"), *given]

    def flags(self) -> list[str]:
        return ["--evaluate"] if self.verify_inputs else ["--evaluate", "--seed", str(GOLDEN_SEED)]

    def tool_arguments(self) -> list[str]:
        module = self.input_paths()[0]
        (golden,) = self.output_paths()
        given = ["--inputs", self.verify_inputs] if self.verify_inputs else []
        return ["--input", self.rel(module), "--output", self.rel(golden), *self.flags(), *given]


@JobRegistry.register
class Frontend(JobSpec):
    """F2: optimize the Penguin IR (loop fusion, common loads, dead code, software pipelining; not at
    -O0), then generate BIR from it (BirCodeGenLoop)."""

    tool = "hlo_opt"
    output_names = ("bir.pb",)

    def input_paths(self) -> list[Path]:
        return [self.artifact("HLOToTensorizer", "penguin.pb")]

    def flags(self) -> list[str]:
        passes = ["--penguin-passes", self.penguin_passes] if self.penguin_passes else []
        stages = ["--num-stages", str(self.num_stages)] if self.num_stages else []
        loops = ["--loops", self.loops] if self.loops != DEFAULT_LOOPS else []
        return [*passes, *stages, *loops, "--optlevel", str(self.optlevel)]

    def tool_arguments(self) -> list[str]:
        (penguin,) = self.input_paths()
        (bir,) = self.output_paths()
        return ["--input", self.rel(penguin), "--output", self.rel(bir), *self.flags()]


@JobRegistry.register
class WalrusDriver(JobSpec):
    """The backend: one process runs the --walrus-passes list over BIR (schedule, allocate, sync, ...)."""

    tool = "walrus_driver"
    output_names = ("program.pb", "stats.json")

    def input_paths(self) -> list[Path]:
        return [self.artifact("Frontend", "bir.pb")]

    def flags(self) -> list[str]:
        passes = ["--walrus-passes", self.walrus_passes] if self.walrus_passes else []
        return [*passes, "--optlevel", str(self.optlevel)]

    def tool_arguments(self) -> list[str]:
        (bir,) = self.input_paths()
        program, stats = self.output_paths()
        return [
            "--input",
            self.rel(bir),
            "--output",
            self.rel(program),
            *self.flags(),
            "--stats",
            self.rel(stats),
        ]


@JobRegistry.register
class Packager(JobSpec):
    """Write the per-engine instruction streams and tables of the program into a NEFF."""

    tool = "packager"
    output_names = (NEFF_NAME,)

    def input_paths(self) -> list[Path]:
        return [self.artifact("WalrusDriver", "program.pb")]

    def metadata(self) -> dict[str, str]:
        """What the NEFF says about how it was made (shown by `ncc inspect`)."""
        return {
            "compiler": "ncc",
            "ncc_version": ncc_version(),
            "model": Path(self.model).name,
            "input_sha256": digests.sha256_file(Path(self.model)),
            "flags": " ".join(self.compile_flags),
        }

    def flags(self) -> list[str]:
        return ["--metadata", *(f"{key}={value}" for key, value in sorted(self.metadata().items()))]

    def tool_arguments(self) -> list[str]:
        (program,) = self.input_paths()
        (neff,) = self.output_paths()
        return ["--input", self.rel(program), "--output", self.rel(neff), *self.flags()]


@JobRegistry.register
class NeffVerifier(JobSpec):
    """Execute the NEFF on the simulator with the golden inputs and compare with the golden outputs."""

    tool = "sim"
    output_names = ("sim_report.json", "sim_out.pb")

    def input_paths(self) -> list[Path]:
        return [self.artifact("Packager", NEFF_NAME), self.artifact("GoldenEvaluator", "golden.pb")]

    def flags(self) -> list[str]:
        return []

    def tool_arguments(self) -> list[str]:
        neff, golden = self.input_paths()
        report, sim_out = self.output_paths()
        return [
            "--neff",
            self.rel(neff),
            "--inputs",
            self.rel(golden),
            "--expect",
            self.rel(golden),
            "--report",
            self.rel(report),
            "--output",
            self.rel(sim_out),
        ]
