"""Compile-time benchmark of the ncc driver on real JAX models (`make bench`).

For each model: compile it REPS times from scratch (a fresh work directory each time, so every
job runs), then execute the NEFF once with `ncc run` on the model's own inputs. Prints a table,
per model:

  compile      median end-to-end wall of `ncc compile` over the REPS runs
  overhead     median of (end-to-end wall / sum of the job walls): 1.0 is a driver that costs nothing
  BIR instrs   instructions the Frontend job unrolled (its bir.pb in the work directory)
  NEFF instrs  instructions in the NEFF after the backend (what `ncc run` executes)
  simulated    the NEFF's simulated time
  max |err|    vs JAX's out0, when the inputs file has it
  XLA:CPU      how long XLA's CPU compiler takes on the same HLO module (NAME.hlo.pb, else the
               HLO text), compiled in this run through the installed JAX: median of REPS fresh
               compiles, XLA's one-time start-up not counted; n/a without JAX. ours/XLA is the
               ratio of our median compile to it

then a second table with the median wall of each job.

    python bench/run_bench.py [--models add_mul,matmul,gelu] [--reps 3] [--models-dir DIR] [--json FILE]

Models are looked up in --models-dir, else ../shared/models beside the repository, else the
project's own copies (models/, tests/data/models/). The default is every bundled model: those
in the first of these folders that has an index.json (in its order), else every NAME.hlo there.
"""

from __future__ import annotations

import argparse
import json
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from dataclasses import asdict, dataclass, field
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
MODEL_DIRS = (ROOT.parent / "shared" / "models", ROOT / "models", ROOT / "tests" / "data" / "models")
JOB_ORDER = ("HLOToTensorizer", "GoldenEvaluator", "Frontend", "WalrusDriver", "Packager", "NeffVerifier")


@dataclass
class ModelResult:
    """One model's medians and measurements; `error` says what failed, if anything."""

    model: str
    reps: int
    wall_s: float = 0.0  # median end-to-end `ncc compile`
    job_wall_s: dict[str, float] = field(default_factory=dict)  # median per job
    overhead_ratio: float = 0.0  # median of (end-to-end wall / sum of job walls)
    bir_instructions: int | None = None  # Frontend's bir.pb
    neff_instructions: int | None = None  # what `ncc run` executed
    simulated_ns: float | None = None
    max_abs_error: float | None = None  # vs JAX's out0, when the inputs file has it
    xla_cpu_compile_s: float | None = None  # timed in this run (None without JAX)
    error: str = ""

    @property
    def ratio_to_xla(self) -> float | None:
        """Our median compile wall over XLA:CPU's compile time, when both are known."""
        if not self.xla_cpu_compile_s or not self.wall_s:
            return None
        return self.wall_s / self.xla_cpu_compile_s


def model_dirs(models_dir: Path | None) -> list[Path]:
    return [models_dir] if models_dir else list(MODEL_DIRS)


def find_model(name: str, models_dir: Path | None) -> Path:
    """The model's HLO (text preferred: it is what a user reads), from the first folder holding it."""
    for directory in model_dirs(models_dir):
        for suffix in (".hlo", ".hlo.pb"):
            if (directory / f"{name}{suffix}").is_file():
                return directory / f"{name}{suffix}"
    searched = models_dir or ", ".join(map(str, MODEL_DIRS))
    raise FileNotFoundError(f"model {name} not found in {searched}")


def bundled_models(models_dir: Path | None) -> list[str]:
    """Every model of the first folder that has any: index.json's order, else each NAME.hlo(.pb) sorted."""
    for directory in model_dirs(models_dir):
        index = directory / "index.json"
        if index.is_file():
            return list(json.loads(index.read_text()))
        names = {path.name.split(".", 1)[0] for path in directory.glob("*.hlo*")}
        if names:
            return sorted(names)
    return []


def jax_installed() -> bool:
    """JAX is an optional extra: without it every XLA column is n/a."""
    try:
        import jax  # noqa: F401
    except ImportError:
        return False
    return True


def median_seconds(action: Callable[[], object], reps: int) -> float:
    """The median wall of `reps` calls of `action`."""
    times = []
    for _ in range(reps):
        started = time.perf_counter()
        action()
        times.append(time.perf_counter() - started)
    return statistics.median(times)


def hlo_module_proto(model: Path) -> bytes:
    """The model's serialized HloModuleProto: NAME.hlo.pb beside it, else its HLO text parsed by XLA."""
    proto = model.parent / f"{model.name.split('.', 1)[0]}.hlo.pb"
    if proto.is_file():
        return proto.read_bytes()
    from jaxlib import xla_client

    return xla_client.hlo.hlo_module_from_text(model.read_text()).as_serialized_hlo_module_proto()


def xla_cpu_compile_time(model: Path, reps: int) -> float | None:
    """XLA:CPU's compile time of exactly this HLO module, measured now: the median of `reps` compiles.

    jax.jit cannot take HLO, so the module goes the way jax.jit's own lowering goes: HLO ->
    StableHLO (jax.extend.mlir.hlo_to_stablehlo, once, untimed), then the CPU client compiles it
    (Client.compile_and_load, which caches nothing: each call is a full XLA compile). One untimed
    compile first keeps XLA's one-time start-up (LLVM, thread pools) out of the median, as in a
    running JAX program. None without JAX.
    """
    if not jax_installed():
        return None
    from jax.extend import backend as jax_backend
    from jax.extend import mlir as jax_mlir
    from jaxlib import xla_client

    stablehlo = jax_mlir.hlo_to_stablehlo(hlo_module_proto(model))
    cpu = jax_backend.get_backend("cpu")
    devices = xla_client.DeviceList(tuple(cpu.local_devices()[:1]))
    options = jax_backend.get_compile_options(num_replicas=1, num_partitions=1)

    def compile_once() -> object:
        return cpu.compile_and_load(stablehlo, executable_devices=devices, compile_options=options)

    compile_once()
    return median_seconds(compile_once, reps)


def one_line(err: BaseException) -> str:
    """An exception as one line (XLA's messages span several)."""
    text = " ".join(str(err).split())
    return f"{type(err).__name__}: {text}" if text else type(err).__name__


def ncc(*args: str | Path) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "ncc.orchestrator", *map(str, args)], capture_output=True, text=True
    )


def job_walls(workdir: Path) -> dict[str, float]:
    walls = {}
    for record_path in sorted(workdir.glob("[0-9][0-9]_*/record.json")):
        record = json.loads(record_path.read_text())
        walls[record["job"]] = float(record.get("wall_s", 0.0))
    return walls


def bir_instruction_count(workdir: Path) -> int | None:
    """How many instructions the Frontend job's bir.pb holds (None if the job left none)."""
    from ncc.schemas import bir_pb2

    paths = sorted(workdir.glob("[0-9][0-9]_Frontend/bir.pb"))
    if not paths:
        return None
    program = bir_pb2.Program()
    program.ParseFromString(paths[0].read_bytes())
    return len(program.instructions)


def last_line(proc: subprocess.CompletedProcess[str], what: str) -> str:
    return proc.stderr.strip().splitlines()[-1] if proc.stderr.strip() else f"{what} exit {proc.returncode}"


def bench_model(name: str, reps: int, models_dir: Path | None, scratch: Path) -> ModelResult:
    """Compile `name` `reps` times in fresh work directories, then run the NEFF once."""
    result = ModelResult(model=name, reps=reps)
    try:
        model = find_model(name, models_dir)
    except FileNotFoundError as err:
        result.error = str(err)
        return result
    try:
        result.xla_cpu_compile_s = xla_cpu_compile_time(model, reps)
    except Exception as err:  # XLA refusing a module must not cost the rest of the table
        result.error = f"XLA:CPU: {one_line(err)}"
    walls: list[float] = []
    ratios: list[float] = []
    per_job: dict[str, list[float]] = {}
    neff = scratch / f"{name}.neff"
    for rep in range(reps):
        workdir = scratch / f"{name}.rep{rep}.ncc-work"
        started = time.perf_counter()
        proc = ncc("compile", model, "--output", neff, "--workdir", workdir, "--verbose", "0")
        wall = time.perf_counter() - started
        if proc.returncode != 0:
            result.error = last_line(proc, "ncc compile")
            return result
        jobs = job_walls(workdir)
        walls.append(wall)
        ratios.append(wall / sum(jobs.values()) if sum(jobs.values()) > 0 else float("nan"))
        for job, job_wall in jobs.items():
            per_job.setdefault(job, []).append(job_wall)
        if rep == 0:
            result.bir_instructions = bir_instruction_count(workdir)
    result.wall_s = statistics.median(walls)
    result.overhead_ratio = statistics.median(ratios)
    result.job_wall_s = {job: statistics.median(values) for job, values in per_job.items()}

    inputs = model.parent / f"{name}.io.npz"
    if inputs.is_file():
        report = scratch / f"{name}.run.json"
        proc = ncc(
            "run", neff, "--inputs", inputs, "--output", scratch / f"{name}.out.npz", "--report", report
        )
        if report.is_file():
            data = json.loads(report.read_text())
            result.simulated_ns = data.get("simulated_ns")
            result.neff_instructions = data.get("instruction_count")
            errors = [
                row["max_abs_error"]
                for row in data.get("reference_comparison", [])
                if row["max_abs_error"] is not None
            ]
            result.max_abs_error = max(errors) if errors else None
        if proc.returncode != 0:
            result.error = "; ".join(filter(None, [result.error, last_line(proc, "ncc run")]))
    return result


def _table(header: list[str], rows: list[list[str]]) -> list[str]:
    """Left-align the first column, right-align the others."""
    widths = [max(len(row[i]) for row in [header, *rows]) for i in range(len(header))]

    def line(cells: list[str]) -> str:
        pairs = enumerate(zip(cells, widths, strict=True))
        return "  ".join(c.ljust(w) if i == 0 else c.rjust(w) for i, (c, w) in pairs)

    return [line(header), "  ".join("-" * w for w in widths), *(line(row) for row in rows)]


def _fmt(value: float | int | None, spec: str, suffix: str = "") -> str:
    return "n/a" if value is None else f"{value:{spec}}{suffix}"


def render(results: list[ModelResult]) -> str:
    """The summary table, the per-job table, then any failures."""
    ok = [r for r in results if r.job_wall_s]
    reps = sorted({r.reps for r in ok})
    header = [
        f"model (median of {'/'.join(map(str, reps)) or '-'})",
        "compile",
        "overhead",
        "BIR instrs",
        "NEFF instrs",
        "simulated",
        "max |err|",
        "XLA:CPU",
        "ours/XLA",
    ]
    rows = [
        [
            r.model,
            _fmt(r.wall_s, ".3f", " s"),
            _fmt(r.overhead_ratio, ".2f"),
            _fmt(r.bir_instructions, ","),
            _fmt(r.neff_instructions, ","),
            _fmt(None if r.simulated_ns is None else r.simulated_ns / 1000, ".2f", " us"),
            _fmt(r.max_abs_error, ".2g"),
            _fmt(r.xla_cpu_compile_s, ".4f", " s"),
            _fmt(r.ratio_to_xla, ".0f", "x"),
        ]
        for r in ok
    ]
    lines = _table(header, rows) if ok else []
    jobs = [job for job in JOB_ORDER if any(job in r.job_wall_s for r in ok)]
    jobs += sorted({job for r in ok for job in r.job_wall_s} - set(jobs))
    if ok:
        lines.append("")
        lines += _table(
            ["median job wall (s)", *jobs],
            [[r.model, *(_fmt(r.job_wall_s.get(job), ".3f") for job in jobs)] for r in ok],
        )
    failures = [r for r in results if r.error]
    if failures:
        lines.append("")
        lines += [f"{r.model}: {'FAILED' if not r.job_wall_s else 'note'}: {r.error}" for r in failures]
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--models", help="comma-separated model names (default: every bundled model)")
    parser.add_argument("--reps", type=int, default=3, help="compiles per model (default 3)")
    parser.add_argument("--models-dir", type=Path, help="folder of NAME.hlo / NAME.io.npz files")
    parser.add_argument("--json", type=Path, help="also write the results as JSON")
    args = parser.parse_args(argv)
    if args.reps < 1:
        parser.error("--reps must be at least 1")
    if args.models:
        names = [name for name in args.models.split(",") if name]
    else:
        names = bundled_models(args.models_dir)
    if not names:
        parser.error("no models found; pass --models-dir or --models")
    with tempfile.TemporaryDirectory(prefix="ncc-bench-") as scratch:
        results = [bench_model(name, args.reps, args.models_dir, Path(scratch)) for name in names]
    print(render(results))
    if args.json:
        rows = [{**asdict(r), "ratio_to_xla": r.ratio_to_xla} for r in results]
        args.json.write_text(json.dumps(rows, indent=1) + "\n")
    return 1 if any(r.error for r in results) else 0


if __name__ == "__main__":
    sys.exit(main())
