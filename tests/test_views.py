"""Strided views (tools/hlo2penguin/views.py) read the same elements numpy's layout ops produce."""

from __future__ import annotations

import numpy as np
import pytest

from ncc.tools.hlo2penguin.views import View


def gather(view: View, base: np.ndarray) -> np.ndarray:
    index = np.asarray(view.offset)
    for stride, size in zip(view.strides, view.shape, strict=True):
        index = index[..., None] + np.arange(size) * stride
    return base.reshape(-1)[index]


@pytest.fixture
def base() -> np.ndarray:
    return np.arange(4 * 6 * 5, dtype=np.float32).reshape(4, 6, 5)


def test_transpose_and_slice_match_numpy(base: np.ndarray) -> None:
    view = View.whole("x", 1, base.shape).transpose((2, 0, 1)).slice((1, 0, 2), (5, 4, 6), (2, 1, 3))
    np.testing.assert_array_equal(gather(view, base), base.transpose(2, 0, 1)[1:5:2, 0:4, 2:6:3])


def test_broadcast_uses_zero_strides(base: np.ndarray) -> None:
    row = View.whole("x", 1, base.shape).reshape((24, 5))
    column = row.slice((0, 0), (24, 1), (1, 1)).reshape((24,))
    view = column.broadcast((24, 7), (0,))
    assert view.strides[1] == 0
    np.testing.assert_array_equal(gather(view, base), np.broadcast_to(base.reshape(24, 5)[:, :1], (24, 7)))


@pytest.mark.parametrize("shape", [(24, 5), (4, 30), (120,), (2, 2, 6, 5), (1, 4, 1, 30)])
def test_reshape_of_contiguous_view_is_free(base: np.ndarray, shape: tuple[int, ...]) -> None:
    view = View.whole("x", 1, base.shape).reshape(shape)
    assert view is not None
    np.testing.assert_array_equal(gather(view, base), base.reshape(shape))


def test_reshape_merging_transposed_dims_needs_a_copy(base: np.ndarray) -> None:
    transposed = View.whole("x", 1, base.shape).transpose((1, 0, 2))
    assert transposed.reshape((24, 5)) is None
    # splitting or merging dims that stay adjacent in memory is still free
    kept = transposed.reshape((6, 4, 5, 1))
    assert kept is not None
    np.testing.assert_array_equal(gather(kept, base), base.transpose(1, 0, 2).reshape(6, 4, 5, 1))


def test_whole_view_detection(base: np.ndarray) -> None:
    whole = View.whole("x", 1, base.shape)
    assert whole.reshape((24, 5)).is_whole(base.shape)
    assert not whole.transpose((1, 0, 2)).is_whole(base.shape)
    assert not whole.slice((0, 0, 0), (2, 6, 5), (1, 1, 1)).is_whole(base.shape)
