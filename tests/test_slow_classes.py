"""The five small modules that took minutes (issue 36), and a million-element integer module for
the golden evaluator, kept in tests/data/slow_classes/: each now compiles with --verify or is
refused at once with a code (the batch norm under --verify: E305; the million-element sort, whose
bitonic network is still 210 stages, 145k lowered instructions: E306), and the sort evaluates at
once. What each was: a u8 3-D convolution whose im2col copy was tiled one [18, 14] tile per
leading index (104,544 tiles); u16 ops over rank-5 shapes tiled [14, 3] at a time; an
argmax-style variadic reduce; a batch norm over f32[128,64,112,112] tiled [112, 112] at a time and
then verified element by element; a sort of f32/s32[1048576] the golden evaluator ran as a Python
merge sort."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
from conftest import run_ncc

from ncc.tools.common.errors import CompileError
from ncc.tools.common.penguin_budget import instruction_count
from ncc.tools.hlo.hlo_text import parse_hlo_text
from ncc.tools.hlo2penguin.lower import lower_module
from ncc.tools.hlo2penguin.sorting import SORT_MAX_TILE_OPS, network_cost
from ncc.tools.hlo_opt.golden.evaluator import evaluate, make_inputs

DATA = Path(__file__).parent / "data" / "slow_classes"


def lowered_instructions(name: str) -> int:
    return instruction_count(lower_module(parse_hlo_text((DATA / f"{name}.hlo").read_text())))[0]


@pytest.mark.parametrize("name,before,most", [
    ("u8_conv3d", 127_628, 12_000),      # the im2col copy: 104,544 -> 5,808
    ("u16_rank5", 29_427, 2_000),
    ("batchnorm_large", 180_855, 20_000),
])
def test_odd_high_rank_shapes_lower_to_tiles_not_elements(name: str, before: int, most: int) -> None:
    """The lowering's instruction count (what every later job's time follows), before and after
    the tiling plans: each at least 6x fewer."""
    assert lowered_instructions(name) <= most < before


@pytest.mark.slow
@pytest.mark.parametrize("name", ["u8_conv3d", "u16_rank5", "argmax_bf16"])
def test_slow_class_compiles_and_verifies(tmp_path: Path, name: str) -> None:
    result = run_ncc("compile", str(DATA / f"{name}.hlo"), "--verify", "-o", str(tmp_path / "m.neff"),
                     "--workdir", str(tmp_path / "w"), "--timeout", "120")
    assert result.returncode == 0, result.stderr
    assert "Traceback" not in result.stderr


def test_verifying_a_hundred_million_element_batch_norm_is_refused_at_once(tmp_path: Path) -> None:
    result = run_ncc("compile", str(DATA / "batchnorm_large.hlo"), "--verify", "-o", str(tmp_path / "m.neff"),
                     "--workdir", str(tmp_path / "w"), "--timeout", "60")
    assert result.returncode == 1
    assert "[E305] job GoldenEvaluator: too large to verify: " in result.stderr
    assert "holds 102,760,448 elements; the --verify budget is 33,554,432 a value" in result.stderr
    assert "Traceback" not in result.stderr
    assert not (tmp_path / "w" / "03_Frontend").exists()  # refused before the expensive jobs ran


def test_the_million_element_sort_is_refused_at_once(tmp_path: Path) -> None:
    """Its network would compile for minutes (210 stages over 1M elements: WalrusDriver past 400 s,
    rolled or unrolled): refused in the first job, from the shapes, before the network is built."""
    result = run_ncc("compile", str(DATA / "sort_1m.hlo"), "--verify", "-o", str(tmp_path / "m.neff"),
                     "--workdir", str(tmp_path / "w"), "--timeout", "60")
    assert result.returncode == 1, result.stderr
    assert "[E306] job HLOToTensorizer: sort too large: 'sort.148.1589' sorts 1 row of 1,048,576 " \
           "elements as a bitonic network of 210 stages" in result.stderr
    assert "Traceback" not in result.stderr
    assert not (tmp_path / "w" / "03_Frontend").exists()


@pytest.mark.parametrize("rows,count,allowed", [
    (1, 16_384, True),       # compiles with --verify in about 20 s on a 2-core VM at load 4
    (1, 65_536, True),       # 38 s there
    (1, 131_072, False),
    (1, 1 << 20, False),     # the slow class
    (1, 264, True),          # the largest sort of the random bench (seed 28: 1,599)
    (65_536, 31, True),      # many short rows: 15 stages over 64 tiles of rows each
])
def test_the_sort_budget_follows_the_network_s_tile_operations(rows: int, count: int, allowed: bool) -> None:
    cost = network_cost(rows, count, 2, 1)[1]
    assert (cost <= SORT_MAX_TILE_OPS) == allowed


def test_a_sort_over_the_budget_is_refused_before_it_is_built() -> None:
    text = (DATA / "sort_1m.hlo").read_text().replace("1048576", "262144")
    with pytest.raises(CompileError) as refused:
        lower_module(parse_hlo_text(text))
    assert refused.value.code == "E306"


def test_the_million_element_sort_evaluates_to_a_stable_sort() -> None:
    module = parse_hlo_text((DATA / "sort_1m.hlo").read_text())
    keys, payload = make_inputs(module, 0)
    sorted_keys, sorted_payload = evaluate(module, [keys, payload])
    order = np.argsort(keys, kind="stable")
    np.testing.assert_array_equal(sorted_keys, keys[order])
    np.testing.assert_array_equal(sorted_payload, payload[order])


def test_a_million_element_integer_module_evaluates_to_numpy_s_answers() -> None:
    """int_1m.hlo: a plain and a two-key sort, a cumulative sum, an xor reduce, an argmax, a gather
    and a scatter-add, each over 1,048,576 elements (the golden evaluator's bench: docs/performance.md)."""
    module = parse_hlo_text((DATA / "int_1m.hlo").read_text())
    keys, bits, table = make_inputs(module, 0)
    outputs = evaluate(module, [keys, bits, table])
    plain_k, plain_b, two_k, two_b, cumsum, folded, best, at, picked, counts = outputs
    order = np.argsort(keys, kind="stable")
    np.testing.assert_array_equal(plain_k, keys[order])
    np.testing.assert_array_equal(plain_b, bits[order])
    two = np.lexsort((bits, -keys.astype(np.int64)))  # key descending, then bits ascending, stable
    np.testing.assert_array_equal(two_k, keys[two])
    np.testing.assert_array_equal(two_b, bits[two])
    np.testing.assert_array_equal(cumsum, np.cumsum(keys).astype(np.int32))
    assert int(folded) == int(np.bitwise_xor.reduce(bits))
    assert (int(best), int(at)) == (int(keys.max()), int(np.argmax(keys)))
    np.testing.assert_array_equal(picked, table[np.clip(keys, 0, 1023)])
    inside = keys[(keys >= 0) & (keys < 1024)]
    expected = table + np.bincount(inside, minlength=1024)[:, None].astype(np.int32)
    np.testing.assert_array_equal(counts, expected)
