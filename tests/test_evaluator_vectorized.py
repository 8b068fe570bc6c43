"""The golden evaluator's vectorised sort, scatter, gather, any-reducer reduce and scan, each
checked against a plain element-by-element reference written here (XLA's semantics, slowly)."""

from __future__ import annotations

import functools

import numpy as np
import pytest

from ncc.tools.hlo.hlo_text import parse_hlo_text
from ncc.tools.hlo_opt.golden.evaluator import SEQUENTIAL_FOLD, evaluate
from ncc.tools.hlo_opt.golden.sort import key_order, partition_order, simple_key


def run(body: str, *args: np.ndarray, regions: str = "") -> list[np.ndarray]:
    return evaluate(parse_hlo_text(f"HloModule t\n{regions}\nENTRY e {{\n{body}\n}}\n"), list(args))


LEXICOGRAPHIC = """
lex {
  ak = s32[] parameter(0)
  bk = s32[] parameter(1)
  av = f32[] parameter(2)
  bv = f32[] parameter(3)
  gt = pred[] compare(ak, bk), direction=GT
  eq = pred[] compare(ak, bk), direction=EQ
  lt = pred[] compare(av, bv), direction=LT
  tie = pred[] and(eq, lt)
  ROOT r = pred[] or(gt, tie)
}
"""


@pytest.mark.parametrize("n", [1, 2, 7, 64, 333])
def test_sort_with_a_two_key_comparator_is_the_stable_sort_by_its_keys(n: int) -> None:
    rng = np.random.default_rng(n)
    keys = rng.integers(0, 4, (3, n)).astype(np.int32)
    values = rng.integers(0, 3, (3, n)).astype(np.float32)  # many full ties: stability decides
    sk, sv = run(f"k = s32[3,{n}] parameter(0)\nv = f32[3,{n}] parameter(1)\n"
                 f"ROOT s = (s32[3,{n}], f32[3,{n}]) sort(k, v), dimensions={{1}}, to_apply=lex",
                 keys, values, regions=LEXICOGRAPHIC)
    for row in range(3):
        # Python's sort is stable
        order = sorted(range(n), key=lambda i, row=row: (-keys[row, i], values[row, i]))
        np.testing.assert_array_equal(sk[row], keys[row, order])
        np.testing.assert_array_equal(sv[row], values[row, order])


@pytest.mark.parametrize("rows,n", [(1, 1), (4, 1000), (2, 1 << 16)])
def test_partition_order_is_stable_and_agrees_with_argsort(rows: int, n: int) -> None:
    keys = np.random.default_rng(n).integers(-3, 3, (rows, n)).reshape(-1)  # many ties

    def less(first: np.ndarray, second: np.ndarray) -> np.ndarray:
        return keys[first] < keys[second]

    def greater(first: np.ndarray, second: np.ndarray) -> np.ndarray:
        return keys[first] > keys[second]

    grid = keys.reshape(rows, n)
    np.testing.assert_array_equal(partition_order(rows, n, less), key_order(grid, False))
    np.testing.assert_array_equal(partition_order(rows, n, greater), key_order(grid, True))
    for row in range(min(rows, 2)):
        expected = sorted(range(n), key=lambda i, row=row: -grid[row, i])[:50]
        assert list(key_order(grid, True)[row][:50]) == expected


def test_a_plain_comparator_is_recognised_either_way_round() -> None:
    module = parse_hlo_text("HloModule t\nc {\n  a = f32[] parameter(0)\n  b = f32[] parameter(1)\n"
                            "  p = s32[] parameter(2)\n  q = s32[] parameter(3)\n"
                            "  ROOT r = pred[] compare(q, p), direction=LT\n}\n"
                            "ENTRY e {\n  x = f32[4] parameter(0)\n  y = s32[4] parameter(1)\n"
                            "  ROOT s = (f32[4], s32[4]) sort(x, y), dimensions={0}, to_apply=c\n}\n")
    comparator = next(c for c in module.computations if c.name == "c")
    assert simple_key(comparator) == (1, True)  # q < p: by operand 1, descending


def test_a_million_element_sort_is_quick_and_sorted() -> None:
    rng = np.random.default_rng(1)
    keys = rng.standard_normal(1 << 20).astype(np.float32)
    payload = np.arange(1 << 20, dtype=np.int32)
    regions = "c {\n  a = f32[] parameter(0)\n  b = f32[] parameter(1)\n  p = s32[] parameter(2)\n" \
              "  q = s32[] parameter(3)\n  ROOT r = pred[] compare(a, b), direction=LT\n}\n"
    sk, sv = run("x = f32[1048576] parameter(0)\ny = s32[1048576] parameter(1)\n"
                 "ROOT s = (f32[1048576], s32[1048576]) sort(x, y), dimensions={0}, to_apply=c",
                 keys, payload, regions=regions)
    order = np.argsort(keys, kind="stable")
    np.testing.assert_array_equal(sv, order)
    np.testing.assert_array_equal(sk, keys[order])


SCATTER_REGIONS = """
keep_last {
  a = s32[] parameter(0)
  ROOT b = s32[] parameter(1)
}
mix {
  a = s32[] parameter(0)
  b = s32[] parameter(1)
  twice = s32[] add(a, a)
  ROOT r = s32[] add(twice, b)
}
"""


@pytest.mark.parametrize("combine", ["keep_last", "mix"])
def test_scatter_applies_repeated_updates_in_order(combine: str) -> None:
    rng = np.random.default_rng(2)
    operand = rng.integers(0, 9, (6, 3)).astype(np.int32)
    indices = rng.integers(-1, 7, (40, 1)).astype(np.int32)  # repeats, and rows that do not fit
    updates = rng.integers(0, 9, (40, 3)).astype(np.int32)
    (got,) = run("o = s32[6,3] parameter(0)\ni = s32[40,1] parameter(1)\nu = s32[40,3] parameter(2)\n"
                 "ROOT s = s32[6,3] scatter(o, i, u), update_window_dims={1}, inserted_window_dims={0}, "
                 f"scatter_dims_to_operand_dims={{0}}, index_vector_dim=1, to_apply={combine}",
                 operand, indices, updates, regions=SCATTER_REGIONS)
    expected = operand.copy()
    for k, (row,) in enumerate(indices):
        if 0 <= row < 6:
            expected[row] = updates[k] if combine == "keep_last" else 2 * expected[row] + updates[k]
    np.testing.assert_array_equal(got, expected)


def test_gather_clamps_every_window_start() -> None:
    operand = np.arange(5 * 4 * 3, dtype=np.int32).reshape(5, 4, 3)
    indices = np.array([[0, 0], [4, 3], [-2, 1], [2, 9]], dtype=np.int32)
    (got,) = run("o = s32[5,4,3] parameter(0)\ni = s32[4,2] parameter(1)\n"
                 "ROOT g = s32[4,2,3] gather(o, i), offset_dims={1,2}, collapsed_slice_dims={0}, "
                 "start_index_map={0,1}, index_vector_dim=1, slice_sizes={1,2,3}", operand, indices)
    for k, (a, b) in enumerate(indices):
        a, b = min(max(a, 0), 4), min(max(b, 0), 2)
        np.testing.assert_array_equal(got[k], operand[a, b:b + 2, :])


XOR_REGION = "x {\n  a = u32[] parameter(0)\n  b = u32[] parameter(1)\n  ROOT r = u32[] xor(a, b)\n}\n"


@pytest.mark.parametrize("n", [3, SEQUENTIAL_FOLD + 1, 1 << 20])
def test_any_reducer_over_many_elements(n: int) -> None:
    """A reducer the evaluator has no numpy reduction for (xor) over up to a million elements: a
    fold up to SEQUENTIAL_FOLD, a halving tree past it; the same result, being associative."""
    data = np.random.default_rng(n).integers(0, 1 << 32, n, dtype=np.uint64).astype(np.uint32)
    (got,) = run(f"v = u32[{n}] parameter(0)\nz = u32[] constant(0)\n"
                 "ROOT r = u32[] reduce(v, z), dimensions={0}, to_apply=x", data, regions=XOR_REGION)
    assert int(got) == functools.reduce(lambda a, b: a ^ b, data.tolist(), 0)


ADD_REGION = "add {\n  a = s32[] parameter(0)\n  b = s32[] parameter(1)\n  ROOT r = s32[] add(a, b)\n}\n"


@pytest.mark.parametrize("reverse", [False, True])
def test_an_inclusive_scan_of_a_million_is_cumsum(reverse: bool) -> None:
    n = 1 << 20
    data = np.random.default_rng(3).integers(-5, 5, n).astype(np.int32)
    pad = f"0_{n - 1}" if reverse else f"{n - 1}_0"
    (got,) = run(f"v = s32[{n}] parameter(0)\nz = s32[] constant(0)\n"
                 f"ROOT r = s32[{n}] reduce-window(v, z), window={{size={n} pad={pad}}}, to_apply=add", data,
                 regions=ADD_REGION)
    expected = np.cumsum(data[::-1])[::-1] if reverse else np.cumsum(data)
    np.testing.assert_array_equal(got, expected.astype(np.int32))


def test_a_windowed_sum_that_is_no_scan_still_folds_offsets() -> None:
    data = np.arange(10, dtype=np.int32)
    (got,) = run("v = s32[10] parameter(0)\nz = s32[] constant(1)\n"
                 "ROOT r = s32[10] reduce-window(v, z), window={size=10 pad=9_0}, to_apply=add", data,
                 regions=ADD_REGION)  # init 1 is no identity: every padded slot adds 1
    np.testing.assert_array_equal(got, np.cumsum(data) + (10 - np.arange(10)))
