"""The suite of real architectures at real size (models/suite/, issue 35): `make bench-models`.

For each module: `ncc compile --verify --optlevel 2` in a fresh work directory; a module refused
by `--verify`'s budget (E305: a value past 2^25 elements) or failing on its seeded inputs (E610) is
compiled again without it, so the table says whether it compiles and, separately, whether it
could be verified. Then, when inputs exist, `ncc run` on them and the largest error against JAX's
outputs: the committed NAME.io.npz of a cut, or with `--jax` (needs JAX) inputs seeded by
make_suite.py and JAX's outputs computed here for a full-size module (a module --verify failed
with E610 counts as failed unless that comparison passes). The table, per module:

  compile s         `ncc compile` end to end (each job's wall is listed below the table)
  XLA:CPU s         XLA's compile of the same JAX function in this run (xla_cpu.py; with --jax)
  static, executed  the NEFF's instructions, and those its loops execute
  peak MB           the largest peak RSS of the compile's jobs
  simulated us      `ncc run`'s simulated time on the inputs
  busiest us        the engine (not a DMA queue) busy longest in that run, and how long
  sched bound us    the schedule's lower bound (walrus pre_sched: busiest engine, critical path, DMA)
  first-principles  the module's PE FLOPs at the dtype's peak or its minimum HBM bytes at 410 GB/s,
                    whichever is larger (first_principles.py, docs/target.md)
  HBM MB, / min     bytes the simulated run moved to and from HBM, over that minimum

    python bench/run_suite.py [--models gpt2,vit_block] [--cuts] [--jax] [--timeout S] [--json FILE]

Run one compile at a time on a shared machine: the full-size modules take minutes and gigabytes.
"""

from __future__ import annotations

import argparse
import json
import re
import subprocess
import sys
import tempfile
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent))
import xla_cpu  # noqa: E402  (bench/ is not a package)
from first_principles import first_principles  # noqa: E402

from ncc.tools.hlo.hlo_reader import load_module  # noqa: E402
from ncc.tools.target import load_target  # noqa: E402

ROOT = Path(__file__).resolve().parents[1]
# --verify's refusals after which the module is compiled again without it and judged against JAX:
# E305, a value past its budget; E610, a mismatch on --verify's own seeded inputs (the training
# step's AdamW state, seeded N(0, 1), divides by near-zero second moments: docs/performance.md)
UNVERIFIED = ("E305", "E610")
SUITE = ROOT / "models" / "suite"


@dataclass
class SuiteResult:
    """One module's outcome; `outcome` is "ok" or the code of the diagnostic that stopped it."""

    model: str
    outcome: str = "ok"
    verified: str = "yes"  # "yes", or why not ("E305": past --verify's budget)
    message: str = ""
    compile_s: float = 0.0
    jobs: dict[str, float] = field(default_factory=dict)
    peak_rss_mb: int = 0
    static_instructions: int | None = None
    executed_instructions: int | None = None
    simulated_us: float | None = None
    races: int | None = None
    max_error: float | None = None
    tolerance: float | None = None
    xla_cpu_s: float | None = None  # XLA:CPU's compile of the same function, this run (needs JAX)
    lower_bound_us: float | None = None  # the schedule's lower bound (walrus pre_sched, `ncc run`'s report)
    bound_us: float | None = None  # the first-principles bound (first_principles.py)
    bound_by: str = ""  # "PE" or "HBM": which floor it is
    hbm_bytes: int | None = None  # bytes the simulated run moved to and from HBM
    busiest: str = ""  # the engine busy longest in the simulated run, and for how long (us)
    min_hbm_bytes: int | None = None  # every parameter read once, every output written once


def ncc(*args: str | Path, timeout: float | None = None) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "ncc.orchestrator", *map(str, args)], capture_output=True,
                          text=True, timeout=timeout)


def diagnostic_code(stderr: str) -> str:
    """The code of the first `ncc: error: [CODE]` line, or "error"."""
    found = re.search(r"ncc: error: \[(\w+)\]", stderr)
    return found.group(1) if found else "error"


def read_jobs(workdir: Path) -> tuple[dict[str, float], int]:
    """Each job's wall (s) and the largest peak RSS (MB) among them, from the job records."""
    walls, peak = {}, 0
    for record_path in sorted(workdir.glob("0*/record.json")):
        record = json.loads(record_path.read_text())
        walls[str(record["job"])] = round(float(record.get("wall_s", 0.0)), 2)
        peak = max(peak, int(record.get("peak_rss_bytes", 0)) // 2**20)
    return walls, peak


def tolerance(expected: np.ndarray, bf16: bool) -> float:
    """As tests/test_suite_models.py: exact integers, floats 1e-4 (bf16 modules 2e-2) of the largest."""
    if expected.dtype.kind in "biu" or not expected.size:
        return 0.0
    return (2e-2 if bf16 else 1e-4) * max(1.0, float(np.max(np.abs(expected))))


def suite_module():
    """models/suite/make_suite.py, imported (it needs JAX for what it builds)."""
    sys.path.insert(0, str(SUITE))
    import make_suite

    return make_suite


def built(module: str) -> tuple[object, list]:
    """The JAX function of `module` (NAME or NAME_cut) and its make_suite inputs."""
    make_suite = suite_module()
    arch = make_suite.SUITE[module.removesuffix("_cut")]
    return arch.build(arch.cut if module.endswith("_cut") else arch.full)


def jax_io(name: str, path: Path) -> None:
    """Seeded inputs of the full-size `name` (make_suite.py's) and JAX's outputs, as an .io.npz."""
    import jax

    make_suite = suite_module()
    function, inputs = built(name)
    args = make_suite.seeded(inputs, sum(map(ord, name)))
    outputs = jax.tree_util.tree_leaves(jax.jit(function, keep_unused=True)(*args))
    arrays = {f"arg{k}": make_suite.widened(a) for k, a in enumerate(args)}
    arrays.update({f"out{k}": make_suite.widened(np.asarray(o)) for k, o in enumerate(outputs)})
    np.savez(path, **arrays)


def xla_cpu_seconds(module: str) -> float:
    """XLA:CPU's compile time of the module's JAX function, on abstract inputs of its shapes."""
    import jax

    make_suite = suite_module()
    function, inputs = built(module)
    specs = [jax.ShapeDtypeStruct(i.shape, make_suite.jax_dtype(i.dtype)) for i in inputs]
    return xla_cpu.compile_seconds(function, specs)


def bench(name: str, scratch: Path, use_jax: bool, timeout: float) -> SuiteResult:
    result = SuiteResult(name)
    index = json.loads((SUITE / "index.json").read_text())
    floors = first_principles(load_module(str(SUITE / f"{name}.hlo.pb")), load_target("trn1"))
    if floors is not None:
        result.bound_us, result.bound_by = round(floors.ns / 1e3, 1), floors.bound_by
        result.min_hbm_bytes = floors.min_hbm_bytes
    if use_jax:
        result.xla_cpu_s = round(xla_cpu_seconds(name), 3)
    neff, workdir = scratch / f"{name}.neff", scratch / f"{name}.ncc-work"
    flags = ["--optlevel", "2", "--timeout", str(timeout), "--workdir", workdir]
    start = time.perf_counter()
    compiled = ncc("compile", SUITE / f"{name}.hlo.pb", "-o", neff, "--verify", *flags)
    if compiled.returncode != 0 and diagnostic_code(compiled.stderr) in UNVERIFIED:
        result.verified = diagnostic_code(compiled.stderr)
        workdir = scratch / f"{name}.unverified.ncc-work"  # its own records, without the refused job's
        flags[-1] = workdir
        start = time.perf_counter()
        compiled = ncc("compile", SUITE / f"{name}.hlo.pb", "-o", neff, *flags)
    result.compile_s = round(time.perf_counter() - start, 2)
    result.jobs, result.peak_rss_mb = read_jobs(workdir)
    if compiled.returncode != 0:
        result.outcome, result.verified = diagnostic_code(compiled.stderr), "no"
        result.message = compiled.stderr.strip().splitlines()[-1] if compiled.stderr.strip() else ""
        return result
    facts = json.loads(ncc("inspect", neff, "--json").stdout)
    result.static_instructions, result.executed_instructions = facts["instructions"], facts["executed"]
    io = SUITE / f"{name}.io.npz"
    if not io.exists() and use_jax:
        io = scratch / f"{name}.io.npz"
        jax_io(name, io)
    if not io.exists():
        if result.verified == "E610":
            result.outcome = "E610"  # a mismatch nothing else has cleared
        return result
    out, report = scratch / f"{name}.out.npz", scratch / f"{name}.report.json"
    ran = ncc("run", neff, "--inputs", io, "--output", out, "--report", report)
    if ran.returncode != 0:
        result.outcome, result.message = diagnostic_code(ran.stderr), ran.stderr.strip().splitlines()[-1]
        return result
    run_facts = json.loads(report.read_text())
    result.simulated_us = round(float(run_facts["simulated_ns"]) / 1e3, 1)
    result.races = int(run_facts["race_count"])
    if result.races or run_facts["deadlock"]:  # a wrong program, whatever it computed
        result.outcome = "deadlock" if run_facts["deadlock"] else "races"
        result.message = run_facts["deadlock"] or f"{result.races} racing pairs"
    result.hbm_bytes = run_facts.get("hbm_bytes")
    engines = {name: ns for name, ns in run_facts["engine_busy_ns"].items() if not name.startswith("q")}
    if engines:
        engine = max(engines, key=engines.__getitem__)
        result.busiest = f"{engine} {engines[engine] / 1e3:,.0f}"
    if "lower_bound_ns" in run_facts:
        result.lower_bound_us = round(float(run_facts["lower_bound_ns"]) / 1e3, 1)
    bf16 = any(dtype == "bfloat16" for dtype, _ in index[name]["args"])
    checks = []  # (error, tolerance) of every output
    with np.load(io) as expected_all, np.load(out) as got_all:
        for output in sorted(n for n in expected_all.files if n.startswith("out")):
            expected, got = expected_all[output], got_all[output]
            error = float(np.max(np.abs(got.astype(np.float64) - expected))) if got.size else 0.0
            checks.append((error, tolerance(expected, bf16)))
    # the output closest to (or furthest past) its tolerance, as a share of it (an exact one counts
    # only when it is off)
    result.max_error, result.tolerance = max(
        checks, key=lambda check: check[0] / check[1] if check[1] else (float("inf") if check[0] else 0.0))
    if any(error > bound for error, bound in checks) and result.outcome == "ok":
        result.outcome = "mismatch"
    return result


def _figure(value: float | None, form: str = "{:,.1f}") -> str:
    return "n/a" if value is None else form.format(value)


def _ratio(numerator: float | None, denominator: float | None) -> str:
    return "n/a" if numerator is None or not denominator else f"{numerator / denominator:.2f}x"


def render(results: list[SuiteResult]) -> str:
    """The table of every module, then each one's jobs."""
    header = ["model", "outcome", "verified", "compile s", "XLA:CPU s", "ours/XLA", "static", "executed",
              "peak MB", "simulated us", "busiest us", "sched bound us", "ratio", "first-principles us",
              "ratio", "HBM MB", "/ min", "max error (tol)"]
    rows = []
    for r in results:
        error = "n/a" if r.max_error is None else f"{r.max_error:.3g} ({r.tolerance:.3g})"
        bound = "n/a" if r.bound_us is None else f"{r.bound_us:,.1f} {r.bound_by}"
        rows.append([
            r.model, r.outcome, r.verified, f"{r.compile_s:.1f}", _figure(r.xla_cpu_s, "{:.2f}"),
            _ratio(r.compile_s, r.xla_cpu_s), _figure(r.static_instructions, "{:,}"),
            _figure(r.executed_instructions, "{:,}"), f"{r.peak_rss_mb:,}", _figure(r.simulated_us),
            r.busiest or "n/a", _figure(r.lower_bound_us), _ratio(r.simulated_us, r.lower_bound_us), bound,
            _ratio(r.simulated_us, r.bound_us), _figure(None if r.hbm_bytes is None else r.hbm_bytes / 1e6),
            _ratio(r.hbm_bytes, r.min_hbm_bytes), error,
        ])
    widths = [max(len(str(row[k])) for row in [header, *rows]) for k in range(len(header))]
    lines = ["  ".join(str(cell).rjust(width) for cell, width in zip(row, widths, strict=True))
             for row in [header, *rows]]
    lines.insert(1, "  ".join("-" * width for width in widths))
    lines.append("")
    lines.append("jobs (wall s): " + "; ".join(
        f"{r.model}: " + " ".join(f"{job}={wall:g}" for job, wall in r.jobs.items()) for r in results))
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--models", help="comma-separated architectures (default: all of index.json)")
    parser.add_argument("--cuts", action="store_true", help="the cuts (NAME_cut) instead of the full size")
    parser.add_argument("--jax", action="store_true",
                        help="full size: compare with JAX's outputs (needs JAX)")
    parser.add_argument("--timeout", type=float, default=1800, help="wall-clock limit per job, seconds")
    parser.add_argument("--json", type=Path, help="also write the results here")
    args = parser.parse_args(argv)
    index = json.loads((SUITE / "index.json").read_text())
    names = args.models.split(",") if args.models else sorted({entry["arch"] for entry in index.values()})
    results = []
    with tempfile.TemporaryDirectory(prefix="ncc-suite-") as scratch:
        for name in names:
            module = f"{name}_cut" if args.cuts else name
            result = bench(module, Path(scratch), args.jax, args.timeout)
            results.append(result)
            why = f"; {result.message}" if result.message else ""
            print(f"{module}: {result.outcome} in {result.compile_s} s{why}", flush=True)
    print()
    print(render(results))
    if args.json:
        args.json.write_text(json.dumps([asdict(r) for r in results], indent=1) + "\n")
    return 0 if all(r.outcome == "ok" for r in results) else 1


if __name__ == "__main__":
    sys.exit(main())
