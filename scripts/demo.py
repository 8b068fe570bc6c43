"""Compile every bundled JAX model with `ncc compile`, run the NEFF with `ncc run`, compare with JAX.

This is the README's first command: real HLO from JAX in models/, the real CLI, end to end.
Usage: python scripts/demo.py [MODEL ...] [--workdir DIR]
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import time
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parents[1]
MODELS = ROOT / "models"
NCC = [sys.executable, "-m", "ncc.orchestrator.cli"]


def tolerance(expected: np.ndarray, index: dict, model: str) -> float:
    """0 for integers and preds (exact); for floats 1e-4 absolute or relative to the largest value
    (2e-2 with bf16 inputs)."""
    if expected.dtype.kind in "biu":
        return 0.0
    dtypes = {dtype for dtype, _ in index.get(model, {}).get("args", [])}
    scale = max(1.0, float(np.max(np.abs(expected)))) if expected.size else 1.0
    return (2e-2 if "bfloat16" in dtypes else 1e-4) * scale


def worst_error(expected_npz: Path, got_npz: Path, index: dict, model: str) -> tuple[float, bool]:
    """The largest error over every output out0..outN, and whether each is within its tolerance."""
    worst, ok = 0.0, True
    with np.load(expected_npz) as expected_all, np.load(got_npz) as got_all:
        for name in sorted(n for n in expected_all.files if n.startswith("out")):
            expected = expected_all[name]
            got = got_all[name] if name in got_all.files else None
            if got is None or got.shape != expected.shape:
                return float("inf"), False
            difference = np.abs(got.astype(np.float64) - expected.astype(np.float64))
            error = float(np.max(difference)) if got.size else 0.0
            worst = max(worst, error)
            ok = ok and error <= tolerance(expected, index, model)
    return worst, ok


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("models", nargs="*", help="model names (default: every bundled model)")
    parser.add_argument("--workdir", default=str(ROOT / "out"), help="where NEFFs and work dirs go")
    args = parser.parse_args()
    names = args.models or sorted(p.name[: -len(".hlo.pb")] for p in MODELS.glob("*.hlo.pb"))
    index = json.loads((MODELS / "index.json").read_text())
    out = Path(args.workdir)
    out.mkdir(parents=True, exist_ok=True)
    print(f"{'model':<14} {'format':<7} {'compile s':>9} {'sim us':>9} {'max abs err':>12}  result")
    failures = 0
    for name in names:
        for suffix in (".hlo.pb", ".hlo"):
            neff = out / f"{name}{suffix.replace('.', '_')}.neff"
            start = time.perf_counter()
            compiled = subprocess.run(
                [*NCC, "compile", str(MODELS / f"{name}{suffix}"), "--output", str(neff)],
                capture_output=True,
                text=True,
            )
            seconds = time.perf_counter() - start
            if compiled.returncode != 0:
                failures += 1
                reason = compiled.stderr.strip()
                print(f"{name:<14} {suffix:<7} {seconds:>9.2f} {'-':>9} {'-':>12}  FAIL {reason}")
                continue
            result_npz, report = neff.with_suffix(".out.npz"), neff.with_suffix(".report.json")
            ran = subprocess.run(
                [
                    *NCC,
                    "run",
                    str(neff),
                    "--inputs",
                    str(MODELS / f"{name}.io.npz"),
                    "--output",
                    str(result_npz),
                    "--report",
                    str(report),
                ],
                capture_output=True,
                text=True,
            )
            if ran.returncode != 0:
                failures += 1
                print(f"{name:<14} {suffix:<7} {seconds:>9.2f} {'-':>9} {'-':>12}  FAIL {ran.stderr.strip()}")
                continue
            error, ok = worst_error(MODELS / f"{name}.io.npz", result_npz, index, name)
            failures += not ok
            sim_us = json.loads(report.read_text())["simulated_ns"] / 1000
            verdict = "ok" if ok else "MISMATCH"
            print(f"{name:<14} {suffix:<7} {seconds:>9.2f} {sim_us:>9.1f} {error:>12.2e}  {verdict}")
    print(f"{'all ok' if not failures else f'{failures} failed'}")
    return 1 if failures else 0


if __name__ == "__main__":
    sys.exit(main())
