"""Reduction benchmark (`make bench-reduce`): `ncc reduce` of a planted crash on each shared model.

For each model, the planted crash of docs/faults.md (walrus_driver segfaults as `allocation`
starts when a `divide` consumes an `exponential`) is compiled into a fresh work dir; a model that
crashes (F139) is reduced with `ncc reduce MODEL --workdir WORKDIR`, whose environment does not
hold the fault (the reducer replays the one the compile recorded). Printed per model: the
instructions before and after, the steps, the candidates tried, and the reduction's wall time;
a model the fault does not touch compiles and is listed as such.

    python bench/run_reduce.py [--models-dir DIR] [--models a,b] [--jobs N] [--json FILE]
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
MODEL_DIRS = (ROOT.parent / "shared" / "models", ROOT / "models")
PLANTED = "walrus_driver:segv@pass=allocation@op=divide(exponential)"


def models_dir(given: str | None) -> Path:
    for folder in [Path(given)] if given else list(MODEL_DIRS):
        if any(folder.glob("*.hlo")):
            return folder
    raise SystemExit("run_reduce: no folder with *.hlo models found")


def ncc(*args: object, env: dict[str, str] | None = None) -> subprocess.CompletedProcess:
    base = {key: value for key, value in os.environ.items() if key != "NCC_FAULT_INJECT"}
    return subprocess.run(
        [sys.executable, "-m", "ncc.orchestrator", *map(str, args)],
        capture_output=True, text=True, env={**base, **(env or {})},
    )


def reduce_one(model: Path, scratch: Path, jobs: int) -> dict[str, object]:
    row: dict[str, object] = {"model": model.stem}
    workdir = scratch / f"{model.stem}.ncc-work"
    compiled = ncc("compile", model, "--output", scratch / f"{model.stem}.neff", "--workdir", workdir,
                   env={"NCC_FAULT_INJECT": PLANTED})
    if compiled.returncode == 0:
        row["result"] = "no crash (no divide consumes an exponential)"
        return row
    if "[F139]" not in compiled.stderr:
        row["result"] = f"compile failed otherwise: {compiled.stderr.strip()[:120]}"
        return row
    out = scratch / f"{model.stem}.reduced.hlo"
    started = time.perf_counter()
    reduced = ncc("reduce", model, "--workdir", workdir, "--output", out, "--jobs", jobs, "--json")
    row["seconds"] = round(time.perf_counter() - started, 1)
    if reduced.returncode != 0:
        row["result"] = f"reduce failed: {reduced.stderr.strip()[:160]}"
        return row
    report = json.loads(reduced.stdout)
    row.update(
        result="reduced",
        before=report["instructions_before"],
        after=report["instructions_after"],
        steps=len(report["steps"]),
        tried=report["tried"],
        invalid=report["invalid"],
        text=out.read_text(),
    )
    return row


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--models-dir", help="folder of *.hlo models (default: the shared models)")
    parser.add_argument("--models", help="comma-separated model names (default: every *.hlo)")
    parser.add_argument("--jobs", type=int, default=len(os.sched_getaffinity(0)))
    parser.add_argument("--json", type=Path, help="also write every row as JSON")
    args = parser.parse_args()
    folder = models_dir(args.models_dir)
    models = sorted(folder.glob("*.hlo"))
    if args.models:
        wanted = set(args.models.split(","))
        models = [model for model in models if model.stem in wanted]
    print(f"ncc reduce of a planted crash ({PLANTED}), {args.jobs} candidates at a time, models in {folder}")
    print(f"{'model':<14} {'instructions':>14} {'steps':>6} {'tried':>6} {'invalid':>8} {'time':>8}")
    rows = []
    with tempfile.TemporaryDirectory(prefix="ncc-bench-reduce-") as scratch:
        for model in models:
            row = reduce_one(model, Path(scratch), args.jobs)
            rows.append(row)
            if row["result"] == "reduced":
                size = f"{row['before']} -> {row['after']}"
                print(
                    f"{row['model']:<14} {size:>14} {row['steps']:>6} {row['tried']:>6} {row['invalid']:>8} "
                    f"{row['seconds']:>7.1f}s",
                    flush=True,
                )
            else:
                print(f"{row['model']:<14} {row['result']}", flush=True)
    reduced = [row for row in rows if row["result"] == "reduced"]
    if reduced:
        total = sum(float(row["seconds"]) for row in reduced)
        print(f"reduced {len(reduced)} crashing models in {total:.1f} s; largest result "
              f"{max(int(row['after']) for row in reduced)} instructions")
    if args.json:
        args.json.write_text(json.dumps(rows, indent=1) + "\n")
    return 1 if any(str(row["result"]).startswith("reduce failed") for row in rows) else 0


if __name__ == "__main__":
    sys.exit(main())
