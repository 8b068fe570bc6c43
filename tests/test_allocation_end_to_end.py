"""Models whose live set exceeds SBUF compile through the CLI, spill, and still compute the right answer.

Before spilling, these were refused with E403: gelu(x @ W1) @ W2 at D = 2048, B = 512 fragments
SBUF once the scheduler overlaps its tiles, and a batched dot of 128 tiny batches kept every rhs
tile (a full 2 KiB block each) live. The MLP no longer needs to spill (a weight tile reloaded for
each row tile is a fresh buffer each time, not one kept from the first load to the last read);
a fused chain in which every step also reads a value computed long before does. Each
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
@pytest.mark.parametrize("optlevel", ["1", "3"])
def test_a_live_set_larger_than_sbuf_spills_and_verifies(tmp_path: Path, optlevel: str) -> None:
    # fused into one nest, step i reads step i // 2: in program order 28 tiles of 8 KiB a
    # partition are live at once, 224 KiB, more than SBUF (at 4 KiB a tile program order fits,
    # and pre_sched keeps it rather than a schedule that would spill)
    workdir = compile_verified(tmp_path, hlo_gen.fan(n=100, cols=16384), "--optlevel", optlevel)
    allocation = walrus_stats(workdir)["allocation"]
    assert allocation["spills"] > 0 and allocation["spilled_bytes_per_partition"] > 0
    assert allocation["sbuf_peak_bytes"] <= 180224


@pytest.mark.slow
def test_an_unfused_mlp_reloads_its_weights_into_fresh_buffers_and_needs_no_spill(tmp_path: Path) -> None:
    workdir = compile_verified(tmp_path, hlo_gen.mlp(batch=512, d=2048, layers=2), "--penguin-passes=none")
    allocation = walrus_stats(workdir)["allocation"]
    assert allocation["spills"] == 0 and allocation["sbuf_peak_bytes"] <= 180224


@pytest.mark.slow
@pytest.mark.parametrize("optlevel", ["0", "2"])
def test_batched_dot_of_many_small_batches(tmp_path: Path, optlevel: str) -> None:
    workdir = compile_verified(tmp_path, hlo_gen.bdot(batch=128, m=5, k=6, n=7), "--optlevel", optlevel)
    assert walrus_stats(workdir)["allocation"]["sbuf_peak_bytes"] <= 180224


PASSES = ("split_dma,anti_dependency_analyzer,dep_reduction,assign_hwdge_engine,pre_sched,{allocation},"
          "anti_dependency_analyzer,alloc_semaphores,sync_dve_pool,semaphore_reset,lower_sync,birverifier,"
          "codegen,roll_loops")


def test_a_schedule_that_spills_is_made_again_under_a_tighter_limit(tmp_path: Path) -> None:
    """An MBConv block (JAX, tests/data): pre_sched's schedule at its default pressure limit spills
    94 buffers; allocation schedules the block again at 0.5 and keeps that layout, which spills
    fewer bytes, and the NEFF matches JAX on JAX's inputs. With allocation{reschedule=0} the
    spills stay."""
    data = Path(__file__).parent / "data"

    def spills(name: str, allocation: str) -> dict:
        workdir = tmp_path / name
        proc = run_ncc("compile", str(data / "mbconv_block.hlo.pb"), "--output",
                       str(tmp_path / f"{name}.neff"), "--workdir", str(workdir),
                       "--verify-inputs", str(data / "mbconv_block.io.npz"),
                       "--walrus-passes", PASSES.format(allocation=allocation), timeout=600)
        assert proc.returncode == 0, proc.stderr
        return walrus_stats(workdir)["allocation"]

    kept, again = spills("kept", "allocation{reschedule=0}"), spills("again", "allocation")
    assert kept["spills"] > 0 and "rescheduled_at" not in kept
    assert again["rescheduled_at"] == 0.5
    assert again["spilled_bytes_per_partition"] < kept["spilled_bytes_per_partition"]
