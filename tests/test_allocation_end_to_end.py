"""Models whose live set exceeds SBUF compile through the CLI, spill, and still compute the right answer.

Before spilling, these were refused with E403: gelu(x @ W1) @ W2 at D = 2048, B = 512 fragments
SBUF once the scheduler overlaps its tiles, and a batched dot of 128 tiny batches kept every rhs
tile (a full 2 KiB block each) live. Each
compiles with --verify (the golden evaluator and the simulated NEFF must agree, race-free) and the
WalrusDriver job's counters must show the spills or the tile sizing that made it fit.
"""

from __future__ import annotations

import json
from pathlib import Path

import hlo_gen
import pytest
from conftest import run_ncc


def walrus_stats(workdir: Path) -> dict[str, dict]:
    (path,) = workdir.glob("[0-9][0-9]_WalrusDriver/stats.json")
    return {p["label"]: p["stats"] for p in json.loads(path.read_text())["passes"]}


def compile_verified(tmp_path: Path, text: str, *extra: str) -> Path:
    model, workdir = tmp_path / "m.hlo", tmp_path / "m.ncc-work"
    model.write_text(text)
    proc = run_ncc(
        "compile",
        str(model),
        "--output",
        str(tmp_path / "m.neff"),
        "--workdir",
        str(workdir),
        "--verify",
        *extra,
        timeout=600,
    )
    assert proc.returncode == 0, proc.stderr
    return workdir


@pytest.mark.slow
def test_mlp_wider_than_sbuf_spills_and_verifies(tmp_path: Path) -> None:
    # unfused, every layer's intermediate round-trips through SBUF at once: more than it holds
    workdir = compile_verified(tmp_path, hlo_gen.mlp(batch=512, d=2048, layers=2), "--penguin-passes=none")
    allocation = walrus_stats(workdir)["allocation"]
    assert allocation["spills"] > 0 and allocation["spilled_bytes_per_partition"] > 0
    assert allocation["sbuf_peak_bytes"] <= 180224


@pytest.mark.slow
@pytest.mark.parametrize("optlevel", ["0", "2"])
def test_batched_dot_of_many_small_batches(tmp_path: Path, optlevel: str) -> None:
    workdir = compile_verified(tmp_path, hlo_gen.bdot(batch=128, m=5, k=6, n=7), "--optlevel", optlevel)
    assert walrus_stats(workdir)["allocation"]["sbuf_peak_bytes"] <= 180224
