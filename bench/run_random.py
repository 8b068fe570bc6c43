"""The random-module bench (`make bench-random`): compile N random small modules with `--verify`.

Each module comes from bench/random_hlo.py (seeds FIRST .. FIRST + N - 1; the same seed is the
same module), is written as HLO text and compiled with `ncc compile --verify --timeout T` in its
own work dir, WORKERS at a time. Each compile is judged by its exit status and diagnostic:

  ok          exit 0: compiled, and the simulated NEFF matched the golden evaluator
  refused     exit 1 with a coded diagnostic ([Exxx]) the module earned (E2xx: what ncc does not
              take, E302/E305: too large)
  mismatch    exit 5: a miscompile (E610 outputs differ; E410-E412, E611-E613 races, deadlocks)
  traceback   an internal error (exit 3, a traceback, F134/F139) or a failure with no code
  timeout     a job killed at the time limit (F137), or the whole compile past 4 x T

It prints the distribution of compile wall times (median, p99, max), the slowest ten with each
job's wall (record.json), the counts, and the first modules of every bucket but ok; `--json`
writes every result. Exit 1 when any compile was a mismatch, a traceback or a timeout.

    python bench/run_random.py [--count 500] [--first 0] [--workers 2] [--timeout 60]
                               [--loops auto|rolled|unrolled] [--keep DIR] [--json FILE]
"""

from __future__ import annotations

import argparse
import json
import math
import re
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from concurrent.futures import ThreadPoolExecutor
from dataclasses import asdict, dataclass, field
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
import random_hlo  # noqa: E402  (bench/ is not a package)
import run_bench  # noqa: E402

BUCKETS = ("ok", "refused", "mismatch", "traceback", "timeout")
_CODE = re.compile(r"\[([A-Z]\d{3})\]")


@dataclass
class Result:
    seed: int
    bucket: str
    wall_s: float
    code: str = ""
    message: str = ""
    jobs: dict[str, float] = field(default_factory=dict)


def judge(returncode: int, stderr: str) -> tuple[str, str]:
    """(bucket, code) of one `ncc compile --verify` from its exit status and its stderr."""
    match = _CODE.search(stderr)
    code = match.group(1) if match else ""
    if "Traceback" in stderr or returncode == 3 or code in ("F134", "F139"):
        return "traceback", code
    if code == "F137":
        return "timeout", code
    if returncode == 0:
        return "ok", code
    if returncode == 5:
        return "mismatch", code
    if returncode == 1 and code.startswith("E"):
        return "refused", code
    return "traceback", code  # a failure without a diagnostic is the compiler's fault


def compile_one(seed: int, scratch: Path, timeout: float, loops: str = "auto") -> Result:
    """Write module `seed`, compile it with --verify (and `--loops loops`) in its own work dir,
    and judge it."""
    model = scratch / f"random_{seed}.hlo"
    model.write_text(random_hlo.random_module(seed))
    workdir = scratch / f"random_{seed}.work"
    start = time.monotonic()
    try:
        proc = subprocess.run([sys.executable, "-m", "ncc.orchestrator", "compile", str(model), "--verify",
                               "-o", str(scratch / f"random_{seed}.neff"), "--workdir", str(workdir),
                               "--timeout", str(timeout), "--loops", loops], capture_output=True, text=True,
                              timeout=4 * timeout)
    except subprocess.TimeoutExpired:
        return Result(seed, "timeout", time.monotonic() - start, message="the compile passed 4 x --timeout")
    wall = time.monotonic() - start
    bucket, code = judge(proc.returncode, proc.stderr)
    lines = proc.stderr.strip().splitlines()
    return Result(seed, bucket, wall, code, lines[-1] if lines and bucket != "ok" else "",
                  run_bench.job_walls(workdir))


def percentile(values: list[float], fraction: float) -> float:
    """The nearest-rank percentile of `values` (fraction in (0, 1])."""
    ordered = sorted(values)
    return ordered[min(len(ordered), max(1, math.ceil(fraction * len(ordered)))) - 1]


def render(results: list[Result]) -> str:
    walls = [r.wall_s for r in results]
    counts = {bucket: sum(r.bucket == bucket for r in results) for bucket in BUCKETS}
    lines = [f"{len(results)} random modules, ncc compile --verify each",
             f"compile wall: median {statistics.median(walls):.2f} s, p99 {percentile(walls, 0.99):.2f} s, "
             f"max {max(walls):.2f} s",
             "counts: " + ", ".join(f"{bucket} {n}" for bucket, n in counts.items()),
             "", "slowest ten (seed, wall, bucket, per job):"]
    for r in sorted(results, key=lambda r: -r.wall_s)[:10]:
        jobs = ", ".join(f"{job} {wall:.2f}" for job, wall in r.jobs.items())
        lines.append(f"  {r.seed:5d}  {r.wall_s:6.2f} s  {r.bucket:9s} {jobs}")
    codes: dict[str, int] = {}
    for r in results:
        if r.bucket == "refused":
            codes[r.code] = codes.get(r.code, 0) + 1
    if codes:
        lines.append("refusals by code: " + ", ".join(f"{c} {n}" for c, n in sorted(codes.items())))
    for bucket in BUCKETS[1:]:
        for r in [r for r in results if r.bucket == bucket][:5]:
            lines.append(f"{bucket} seed {r.seed}: {r.message}")
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--count", type=int, default=500)
    parser.add_argument("--first", type=int, default=0, help="the first seed")
    parser.add_argument("--workers", type=int, default=2)
    parser.add_argument("--timeout", type=float, default=60.0, help="ncc compile --timeout (per job)")
    parser.add_argument("--loops", choices=("auto", "rolled", "unrolled"), default="auto",
                        help="ncc compile --loops (rolled: every module keeps its loops, small as it is)")
    parser.add_argument("--keep", type=Path, help="keep modules and work dirs here")
    parser.add_argument("--json", type=Path, help="write every result here")
    args = parser.parse_args(argv)
    scratch = args.keep or Path(tempfile.mkdtemp(prefix="ncc-random-"))
    scratch.mkdir(parents=True, exist_ok=True)
    try:
        seeds = range(args.first, args.first + args.count)
        with ThreadPoolExecutor(args.workers) as pool:
            results = list(pool.map(lambda seed: compile_one(seed, scratch, args.timeout, args.loops), seeds))
    finally:
        if args.keep is None:
            shutil.rmtree(scratch, ignore_errors=True)
    print(render(results))
    if args.json:
        args.json.write_text(json.dumps([asdict(r) for r in results], indent=1))
    return 1 if any(r.bucket in ("mismatch", "traceback", "timeout") for r in results) else 0


if __name__ == "__main__":
    sys.exit(main())
