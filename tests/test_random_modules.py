"""Random small modules (bench/random_hlo.py, the random bench's generator): every one is valid
HLO, and a seeded sample compiles with --verify and matches the golden evaluator (or is refused
with a code), with no traceback. The full 500-module run is `make bench-random`."""

from __future__ import annotations

import json
import math
from pathlib import Path

import pytest
import random_hlo
import run_random
from conftest import run_ncc

from ncc.tools.common.penguin_budget import instruction_count
from ncc.tools.hlo.hlo_text import parse_hlo_text
from ncc.tools.hlo.hlo_types import dims, entry_computation, leaf_shapes
from ncc.tools.hlo.hlo_verify import verify_module
from ncc.tools.hlo2penguin.lower import lower_module

SAMPLE = range(1000, 1024)  # seeds the sample compiles; the bench starts at 0


def test_generated_modules_are_valid_small_and_varied() -> None:
    opcodes: set[str] = set()
    types: set[int] = set()
    for seed in range(150):
        module = parse_hlo_text(random_hlo.random_module(seed))
        verify_module(module)
        entry = entry_computation(module)
        assert len(entry.instructions) <= random_hlo.MAX_INSTRUCTIONS
        for instr in entry.instructions:
            for leaf in leaf_shapes(instr.shape):
                assert len(dims(leaf)) <= 5
                assert math.prod(dims(leaf)) <= random_hlo.MAX_ELEMENTS
                types.add(leaf.element_type)
            opcodes.add(instr.opcode)
    assert random_hlo.random_module(7) == random_hlo.random_module(7)  # a seed is a module
    assert {"convolution", "dot", "reduce", "reduce-window", "gather", "scatter", "pad", "concatenate",
            "transpose", "broadcast", "slice", "reverse", "sort", "select", "convert"} <= opcodes
    assert len(types) == len(random_hlo.TYPES)


@pytest.mark.slow
@pytest.mark.parametrize("seed", SAMPLE)
def test_a_random_module_compiles_and_matches_the_golden_evaluator(tmp_path: Path, seed: int) -> None:
    model = tmp_path / f"random_{seed}.hlo"
    model.write_text(random_hlo.random_module(seed))
    result = run_ncc("compile", str(model), "--verify", "-o", str(tmp_path / "m.neff"), "--workdir",
                     str(tmp_path / "w"), "--timeout", "120")
    bucket, code = run_random.judge(result.returncode, result.stderr)
    assert bucket in ("ok", "refused"), result.stderr
    assert bucket == "ok" or code in ("E302", "E305") or code.startswith("E2"), result.stderr


@pytest.mark.slow
@pytest.mark.parametrize("seed", SAMPLE[:3])
def test_a_random_module_compiles_rolled_and_matches(tmp_path: Path, seed: int) -> None:
    """The bench's --loops rolled: every loop of a small module stays a loop where it can, and
    the NEFF still matches the golden evaluator (or the module is refused with a code)."""
    result = run_random.compile_one(seed, tmp_path, 120.0, loops="rolled")
    assert result.bucket in ("ok", "refused"), result.message
    settings = json.loads((tmp_path / f"random_{seed}.work" / "run_settings.json").read_text())
    assert "--loops=rolled" in settings["command"]


def test_a_small_sort_among_many_nests_lowers_to_few_instructions() -> None:
    """Seed 419 sorts u32[19,28] along each dimension (rows of 19 and 28 padded to 32): a stage's
    parts are [rows, 2^a, 2^b, 2^c] views, which tiled as written were a [2^b, 2^c] tile per row
    and 2^a (43k lowered instructions, 31 s of compile); walked in the order of fewest tiles,
    rows across the partitions, they are 5k (4 s)."""
    module = parse_hlo_text(random_hlo.random_module(419))
    assert instruction_count(lower_module(module))[0] < 8_000


@pytest.mark.parametrize("returncode,stderr,bucket", [
    (0, "ncc: compiled m.hlo -> m.neff", "ok"),
    (1, "ncc: error: [E207] job HLOToTensorizer: a while loop ...", "refused"),
    (5, "ncc: error: [E610] job NeffVerifier: out0 differs", "mismatch"),
    (4, "ncc: error: [F137] job WalrusDriver was forcibly killed (SIGKILL) by ncc", "timeout"),
    (4, "ncc: error: [F134] job Frontend died", "traceback"),
    (3, "Traceback (most recent call last):", "traceback"),
    (1, "something went wrong without a code", "traceback"),
])
def test_the_bench_judges_a_compile_by_its_exit_and_code(returncode: int, stderr: str, bucket: str) -> None:
    assert run_random.judge(returncode, stderr)[0] == bucket


def test_the_bench_prints_the_distribution_and_the_slowest_ten() -> None:
    results = [run_random.Result(seed, "ok", float(seed), jobs={"Frontend": 0.5}) for seed in range(1, 101)]
    results[3] = run_random.Result(4, "refused", 4.0, "E302", "ncc: error: [E302] ...")
    text = run_random.render(results)
    assert "median 50.50 s, p99 99.00 s, max 100.00 s" in text
    assert "ok 99, refused 1, mismatch 0, traceback 0, timeout 0" in text
    assert "refusals by code: E302 1" in text
    slowest = text.split("slowest ten")[1].splitlines()[1:11]
    assert [int(line.split()[0]) for line in slowest] == list(range(100, 90, -1))
    assert "Frontend 0.50" in slowest[0]


def test_the_evaluator_bench_times_a_module(capsys: pytest.CaptureFixture[str]) -> None:
    import run_evaluator

    assert run_evaluator.main([str(Path(__file__).parent / "data" / "slow_classes" / "u16_rank5.hlo"),
                               "--reps", "1"]) == 0
    assert "u16_rank5.hlo" in capsys.readouterr().out
