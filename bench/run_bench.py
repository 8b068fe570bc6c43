"""Compile-time benchmark of the ncc driver on real JAX models (`make bench`).

For each model: compile it REPS times from scratch (a fresh work directory each time, so every
job runs), then execute the NEFF once with `ncc run` on the model's own inputs. Prints per model
the median end-to-end wall of `ncc compile`, the median wall of each job (from the job records),
the orchestration overhead ratio = end-to-end wall / sum of the job walls (1.0 would be a
driver that costs nothing), and the simulated time of the NEFF.

    python bench/run_bench.py [--models add_mul,matmul,gelu] [--reps 3] [--models-dir DIR] [--json FILE]

Models are looked up in --models-dir, else ../shared/models beside the repository, else the
project's own copies (models/, tests/data/models/).
"""

from __future__ import annotations

import argparse
import json
import statistics
import subprocess
import sys
import tempfile
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
DEFAULT_MODELS = ("add_mul", "matmul", "gelu")
MODEL_DIRS = (ROOT.parent / "shared" / "models", ROOT / "models", ROOT / "tests" / "data" / "models")


@dataclass
class ModelResult:
    model: str
    reps: int
    wall_s: float = 0.0  # median end-to-end `ncc compile`
    job_wall_s: dict[str, float] = field(default_factory=dict)  # median per job
    overhead_ratio: float = 0.0  # median of (end-to-end wall / sum of job walls)
    simulated_ns: float | None = None
    max_abs_error: float | None = None  # vs JAX's out0, when the inputs file has it
    error: str = ""


def find_model(name: str, models_dir: Path | None) -> Path:
    """The model's HLO (text preferred: it is what a user reads), from the first folder holding it."""
    for directory in [models_dir] if models_dir else list(MODEL_DIRS):
        for suffix in (".hlo", ".hlo.pb"):
            if (directory / f"{name}{suffix}").is_file():
                return directory / f"{name}{suffix}"
    searched = models_dir or ", ".join(map(str, MODEL_DIRS))
    raise FileNotFoundError(f"model {name} not found in {searched}")


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


def bench_model(name: str, reps: int, models_dir: Path | None, scratch: Path) -> ModelResult:
    result = ModelResult(model=name, reps=reps)
    try:
        model = find_model(name, models_dir)
    except FileNotFoundError as err:
        result.error = str(err)
        return result
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
            result.error = (
                proc.stderr.strip().splitlines()[-1] if proc.stderr.strip() else f"exit {proc.returncode}"
            )
            return result
        jobs = job_walls(workdir)
        walls.append(wall)
        ratios.append(wall / sum(jobs.values()) if sum(jobs.values()) > 0 else float("nan"))
        for job, job_wall in jobs.items():
            per_job.setdefault(job, []).append(job_wall)
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
            errors = [
                row["max_abs_error"]
                for row in data.get("reference_comparison", [])
                if row["max_abs_error"] is not None
            ]
            result.max_abs_error = max(errors) if errors else None
        if proc.returncode != 0:
            result.error = (
                proc.stderr.strip().splitlines()[-1]
                if proc.stderr.strip()
                else f"ncc run exit {proc.returncode}"
            )
    return result


def render(results: list[ModelResult]) -> str:
    lines = []
    for r in results:
        if r.error and not r.job_wall_s:
            lines.append(f"{r.model}: FAILED: {r.error}")
            continue
        simulated = f"{r.simulated_ns / 1000:.2f} us" if r.simulated_ns is not None else "n/a"
        error = f", max |err| vs JAX {r.max_abs_error:.2g}" if r.max_abs_error is not None else ""
        lines.append(
            f"{r.model}: compile {r.wall_s:.3f} s (median of {r.reps}), "
            f"overhead ratio {r.overhead_ratio:.2f}, simulated {simulated}{error}"
        )
        for job, wall in r.job_wall_s.items():
            lines.append(f"    {job:<16} {wall:.3f} s")
        if r.error:
            lines.append(f"    note: {r.error}")
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--models", default=",".join(DEFAULT_MODELS), help="comma-separated model names")
    parser.add_argument("--reps", type=int, default=3, help="compiles per model (default 3)")
    parser.add_argument("--models-dir", type=Path, help="folder of NAME.hlo / NAME.io.npz files")
    parser.add_argument("--json", type=Path, help="also write the results as JSON")
    args = parser.parse_args(argv)
    names = [name for name in args.models.split(",") if name]
    with tempfile.TemporaryDirectory(prefix="ncc-bench-") as scratch:
        results = [bench_model(name, args.reps, args.models_dir, Path(scratch)) for name in names]
    print(render(results))
    if args.json:
        args.json.write_text(json.dumps([asdict(r) for r in results], indent=1) + "\n")
    return 1 if any(r.error for r in results) else 0


if __name__ == "__main__":
    sys.exit(main())
