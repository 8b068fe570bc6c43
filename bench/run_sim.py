"""Simulator benchmark (`make bench-sim`): `ncc run` on rolled NEFFs of growing executed size.

Each size is a pipelined NEFF from bench/sim_gen.py executing about that many instructions
(default 16k, 100k and 1M), and `--chain N` adds the rolled NEFF `ncc compile` makes of hlo_gen's
N-op chain (2,000 ops: 16k executed, SBUF addresses rotating over 8 buffers). Each is run REPS
times by `ncc run` in a fresh process, and the table shows per NEFF:

  executed   instructions the run executed (its report's instruction_count)
  wall       median wall of the `ncc run` process: start-up, reading, simulating, writing
  us/instr   median wall / executed
  simulate   median of the simulation alone (the report's host_wall_s)
  CPU        median user + sys of the process (steadier than wall on a shared machine)
  peak RSS   the largest resident set of the runs
  simulated  the simulated time

then the growth of wall and of CPU with executed instructions over the generated sizes: the
log-log slope between consecutive sizes and over all of them (1 = linear). A pipelined NEFF's
outputs are checked against sim_gen.reference_output; a run that fails or differs shows its error
in place of its numbers, and the benchmark exits 1.

    python bench/run_sim.py [--sizes 16000,100000,1000000] [--chain 2000] [--reps 3] [--timeout 900]
                            [--json FILE] [--keep DIR]
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent))
import hlo_gen  # noqa: E402  (bench/ is not a package)
import run_scale  # noqa: E402
import sim_gen  # noqa: E402

from ncc.tools.packager.neff import write_neff  # noqa: E402

DEFAULT_SIZES = (16_000, 100_000, 1_000_000)
DEFAULT_TIMEOUT_S = 900.0


@dataclass
class Run:
    """One `ncc run` process."""

    wall_s: float
    cpu_s: float
    peak_rss_bytes: int
    simulate_s: float = 0.0
    executed: int = 0
    simulated_ns: float = 0.0


@dataclass
class SimResult:
    """One NEFF's runs; `error` says what failed, if anything."""

    label: str
    generated: bool  # a sim_gen size (part of the growth fit)
    runs: list[Run] = field(default_factory=list)
    error: str = ""

    def median(self, name: str) -> float:
        return statistics.median(getattr(run, name) for run in self.runs)

    def as_json(self) -> dict:
        row = asdict(self)
        if self.runs:
            row |= {
                "executed": self.runs[0].executed,
                "wall_s": self.median("wall_s"),
                "cpu_s": self.median("cpu_s"),
                "simulate_s": self.median("simulate_s"),
                "us_per_instruction": 1e6 * self.median("wall_s") / max(1, self.runs[0].executed),
                "peak_rss_bytes": max(run.peak_rss_bytes for run in self.runs),
            }
        return row


def run_once(argv: list[str], timeout_s: float) -> tuple[Run, int, str]:
    """Run `argv` to completion (killed after `timeout_s`): its Run, exit status and stderr."""
    with tempfile.TemporaryFile() as err:
        started = time.perf_counter()
        proc = subprocess.Popen(argv, stdout=subprocess.DEVNULL, stderr=err)
        timer = threading.Timer(timeout_s, proc.kill)
        timer.start()
        try:
            _, status, usage = os.wait4(proc.pid, 0)  # this child's own rusage: CPU and peak RSS
        finally:
            timer.cancel()
        proc.returncode = os.waitstatus_to_exitcode(status)
        wall = time.perf_counter() - started
        err.seek(0)
        stderr = err.read().decode(errors="replace")
    if proc.returncode < 0:
        stderr += f"\nkilled after {timeout_s:g} s" if wall >= timeout_s else f"\nsignal {-proc.returncode}"
    run = Run(wall, usage.ru_utime + usage.ru_stime, usage.ru_maxrss * 1024)
    return run, proc.returncode, stderr


def bench_neff(
    label: str,
    neff: Path,
    inputs: Path,
    reps: int,
    timeout_s: float,
    expected: np.ndarray | None,
    generated: bool,
) -> SimResult:
    """`reps` runs of `ncc run` on `neff`; out0 checked against `expected` when given."""
    result = SimResult(label, generated)
    output, report = neff.with_suffix(".out.npz"), neff.with_suffix(".report.json")
    argv = [sys.executable, "-m", "ncc.orchestrator", "run", str(neff), "--inputs", str(inputs),
            "--output", str(output), "--report", str(report)]
    for _ in range(reps):
        run, status, stderr = run_once(argv, timeout_s)
        if status != 0:
            lines = stderr.strip().splitlines()
            result.error = lines[-1] if lines else f"ncc run exit {status}"
            return result
        document = json.loads(report.read_text())
        run.simulate_s = float(document["host_wall_s"])
        run.executed = int(document["instruction_count"])
        run.simulated_ns = float(document["simulated_ns"])
        result.runs.append(run)
        print(f"  {label}: {run.wall_s:.1f} s", file=sys.stderr, flush=True)
    if expected is not None:
        got = np.load(output)["out0"]
        error = float(np.max(np.abs(got - expected)))
        if error > 2.0**-7 * float(np.max(np.abs(expected))):  # bf16 hidden values: one ulp apart at most
            result.error = f"out0 differs from sim_gen.reference_output by {error:.3g}"
    return result


def bench_size(executed: int, reps: int, timeout_s: float, scratch: Path) -> SimResult:
    shape = sim_gen.shape_for(executed)
    neff = scratch / f"pipeline_{executed}.neff"
    inputs = sim_gen.pipeline_inputs(shape)
    write_neff(neff, sim_gen.pipeline_neff(shape))
    np.savez(neff.with_suffix(".io.npz"), **inputs)
    expected = sim_gen.reference_output(shape, inputs)
    label = f"pipeline {executed:,}"
    return bench_neff(label, neff, neff.with_suffix(".io.npz"), reps, timeout_s, expected, True)


def bench_chain(ops: int, reps: int, timeout_s: float, scratch: Path) -> SimResult:
    model, neff = scratch / f"chain_{ops}.hlo", scratch / f"chain_{ops}.neff"
    model.write_text(hlo_gen.hlo_text("chain", n=ops))
    compiled = subprocess.run(
        [sys.executable, "-m", "ncc.orchestrator", "compile", str(model), "-o", str(neff),
         "--workdir", str(scratch / f"chain_{ops}.work")],
        capture_output=True, text=True, timeout=timeout_s,
    )
    if compiled.returncode != 0:
        return SimResult(f"chain n={ops}", False, error=compiled.stderr.strip().splitlines()[-1])
    inputs = neff.with_suffix(".io.npz")
    np.savez(inputs, arg0=np.random.default_rng(0).standard_normal((512, 1024)).astype(np.float32))
    return bench_neff(f"chain n={ops}", neff, inputs, reps, timeout_s, None, False)


def render(results: list[SimResult], reps: int) -> str:
    lines = [
        f"ncc run, median of {reps}:",
        f"{'NEFF':<20} {'executed':>10} {'wall':>8} {'us/instr':>9} {'simulate':>9} {'CPU':>8} "
        f"{'peak RSS':>9} {'simulated':>12}",
    ]
    for r in results:
        if r.error:
            lines.append(f"{r.label:<20} {r.error}")
            continue
        row = r.as_json()
        lines.append(
            f"{r.label:<20} {row['executed']:>10,} {row['wall_s']:>7.2f}s {row['us_per_instruction']:>9.1f} "
            f"{row['simulate_s']:>8.2f}s {row['cpu_s']:>7.2f}s {row['peak_rss_bytes'] / 2**20:>7.0f}MB "
            f"{r.runs[0].simulated_ns / 1e6:>10.3f}ms"
        )
    for name, what in (("wall_s", "wall"), ("cpu_s", "CPU")):
        points = _points(results, name)
        steps = [run_scale.slope([a, b]) for a, b in zip(points, points[1:], strict=False)]
        if steps:
            between = ", ".join(f"{s:.2f}" for s in steps if s is not None)
            lines.append(
                f"growth of {what} with executed instructions: {between} between sizes, "
                f"{run_scale.slope(points):.2f} overall (1 = linear)"
            )
    return "\n".join(lines)


def _points(results: list[SimResult], name: str) -> list[tuple[float, float]]:
    """(executed, median `name`) of the generated sizes that ran."""
    return [(r.runs[0].executed, r.median(name)) for r in results if r.generated and not r.error]


def growth(results: list[SimResult]) -> dict[str, float | None]:
    return {name: run_scale.slope(_points(results, name)) for name in ("wall_s", "cpu_s")}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument(
        "--sizes", default=",".join(map(str, DEFAULT_SIZES)),
        help="comma-separated executed-instruction counts of generated NEFFs (default 16000,100000,1000000)",
    )
    parser.add_argument(
        "--chain", type=int, default=2000, help="also the compiled N-op chain (0: none; default 2000)"
    )
    parser.add_argument("--reps", type=int, default=3, help="ncc runs per NEFF (median; default 3)")
    parser.add_argument(
        "--timeout", type=float, default=DEFAULT_TIMEOUT_S, help="seconds one ncc run may take"
    )
    parser.add_argument("--json", type=Path, help="also write the results as JSON")
    parser.add_argument("--keep", type=Path, metavar="DIR", help="write the NEFFs here and keep them")
    args = parser.parse_args(argv)
    try:
        sizes = [int(size) for size in args.sizes.split(",") if size]
    except ValueError:
        parser.error(f"--sizes must be whole numbers, got {args.sizes!r}")
    if args.reps < 1 or any(size < 1 for size in sizes):
        parser.error("--reps and every size must be at least 1")
    results = []
    with contextlib.ExitStack() as stack:
        scratch = run_scale.scratch_dir(stack, args.keep, "ncc-bench-sim-")
        if args.chain:
            results.append(bench_chain(args.chain, args.reps, args.timeout, scratch))
        for size in sizes:
            results.append(bench_size(size, args.reps, args.timeout, scratch))
    print(render(results, args.reps))
    if args.json:
        document = {
            "machine": run_scale.machine(),
            "reps": args.reps,
            "results": [r.as_json() for r in results],
            "growth": growth(results),
        }
        args.json.write_text(json.dumps(document, indent=1) + "\n")
    return 1 if any(r.error for r in results) else 0


if __name__ == "__main__":
    sys.exit(main())
