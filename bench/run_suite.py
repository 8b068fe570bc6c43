"""The suite of real architectures at real size (models/suite/, issue 35): compile, verify, compare.

For each module: `ncc compile --verify --optlevel 2` in a fresh work directory; a module refused
by `--verify`'s budget (E305: a value past 2^25 elements) is compiled again without it, so the
table says whether it compiles and, separately, whether it could be verified. Then, when inputs
exist, `ncc run` on them and the largest error against JAX's outputs: the committed
NAME.io.npz of a cut, or with `--jax` (needs JAX) inputs seeded by make_suite.py and JAX's outputs
computed here for a full-size module. Per module it prints the outcome (ok, or the diagnostic's
code), each job's wall, the largest peak RSS, the NEFF's static and executed instruction counts
and the simulated time.

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

ROOT = Path(__file__).resolve().parents[1]
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


def jax_io(name: str, path: Path) -> None:
    """Seeded inputs of the full-size `name` (make_suite.py's) and JAX's outputs, as an .io.npz."""
    import jax

    sys.path.insert(0, str(SUITE))
    import make_suite

    arch = make_suite.SUITE[name]
    function, inputs = arch.build(arch.full)
    args = make_suite.seeded(inputs, sum(map(ord, name)))
    outputs = jax.tree_util.tree_leaves(jax.jit(function, keep_unused=True)(*args))
    arrays = {f"arg{k}": make_suite.widened(a) for k, a in enumerate(args)}
    arrays.update({f"out{k}": make_suite.widened(np.asarray(o)) for k, o in enumerate(outputs)})
    np.savez(path, **arrays)


def bench(name: str, scratch: Path, use_jax: bool, timeout: float) -> SuiteResult:
    result = SuiteResult(name)
    index = json.loads((SUITE / "index.json").read_text())
    neff, workdir = scratch / f"{name}.neff", scratch / f"{name}.ncc-work"
    flags = ["--optlevel", "2", "--timeout", str(timeout), "--workdir", workdir]
    start = time.perf_counter()
    compiled = ncc("compile", SUITE / f"{name}.hlo.pb", "-o", neff, "--verify", *flags)
    if compiled.returncode != 0 and diagnostic_code(compiled.stderr) == "E305":
        result.verified = "E305"
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
        return result
    out, report = scratch / f"{name}.out.npz", scratch / f"{name}.report.json"
    ran = ncc("run", neff, "--inputs", io, "--output", out, "--report", report)
    if ran.returncode != 0:
        result.outcome, result.message = diagnostic_code(ran.stderr), ran.stderr.strip().splitlines()[-1]
        return result
    run_facts = json.loads(report.read_text())
    result.simulated_us = round(float(run_facts["simulated_ns"]) / 1e3, 1)
    result.races = len(run_facts["races"])
    bf16 = any(dtype == "bfloat16" for dtype, _ in index[name]["args"])
    checks = []  # (error, tolerance) of every output
    with np.load(io) as expected_all, np.load(out) as got_all:
        for output in sorted(n for n in expected_all.files if n.startswith("out")):
            expected, got = expected_all[output], got_all[output]
            error = float(np.max(np.abs(got.astype(np.float64) - expected))) if got.size else 0.0
            checks.append((error, tolerance(expected, bf16)))
    # the output closest to (or furthest past) its tolerance
    result.max_error, result.tolerance = max(checks, key=lambda check: check[0] - check[1])
    if any(error > bound for error, bound in checks):
        result.outcome = "mismatch"
    return result


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
            jobs = " ".join(f"{job}={wall:g}" for job, wall in result.jobs.items())
            error = ("n/a" if result.max_error is None
                     else f"{result.max_error:.3g} (tol {result.tolerance:.3g})")
            print(f"{module}: {result.outcome}, verified {result.verified}, compile {result.compile_s} s "
                  f"[{jobs}], peak {result.peak_rss_mb} MB, instructions {result.static_instructions} "
                  f"static / {result.executed_instructions} executed, simulated {result.simulated_us} us, "
                  f"races {result.races}, max error {error}" + (f"; {result.message}" * bool(result.message)),
                  flush=True)
    if args.json:
        args.json.write_text(json.dumps([asdict(r) for r in results], indent=1) + "\n")
    return 0 if all(r.outcome == "ok" for r in results) else 1


if __name__ == "__main__":
    sys.exit(main())
