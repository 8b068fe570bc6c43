"""Random small modules (bench/random_hlo.py, the random bench's generator): every one is valid
HLO, and a seeded sample compiles with --verify and matches the golden evaluator (or is refused
with a code), with no traceback. The full 500-module run is `make bench-random`."""

from __future__ import annotations

import math
from pathlib import Path

import pytest
import random_hlo
import run_random
from conftest import run_ncc

from ncc.tools.hlo.hlo_text import parse_hlo_text
from ncc.tools.hlo.hlo_types import dims, entry_computation, leaf_shapes
from ncc.tools.hlo.hlo_verify import verify_module

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
