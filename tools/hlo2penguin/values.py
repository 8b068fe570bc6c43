"""The values the lowering passes around, and the constants every part of it shares.

A Value is a View (an HBM tensor read through strides), a Splat (one scalar known at compile time,
repeated over a shape) or a tuple of Values.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from ncc.schemas import common_pb2
from ncc.tools.common.dtypes import is_float
from ncc.tools.hlo2penguin.views import View

FREE_TILE = 2048  # elements per partition in an elementwise tile
SP, ACT, DVE, POOL, PE = common_pb2.SP, common_pb2.ACT, common_pb2.DVE, common_pb2.POOL, common_pb2.PE


@dataclass(frozen=True)
class Splat:
    """A value known at compile time to be one scalar repeated over `shape`."""

    value: float
    dtype: int
    shape: tuple[int, ...]


Value = View | Splat | tuple


def is_integer(dtype: int) -> bool:
    return not is_float(dtype) and dtype != common_pb2.PRED


def broadcast_to(value: Value, shape: tuple[int, ...]) -> Value:
    """A scalar (constant or array of shape ()) repeated over `shape`."""
    if isinstance(value, Splat):
        return Splat(value.value, value.dtype, shape)
    return value.broadcast(shape, ())


def transposed(value: View | Splat, order: tuple[int, ...]) -> View | Splat:
    """`value` with its dimensions in `order` (a splat needs no data moved)."""
    if isinstance(value, Splat):
        return Splat(value.value, value.dtype, tuple(value.shape[k] for k in order))
    return value.transpose(order)


def product(sizes: tuple[int, ...]) -> int:
    return int(np.prod(sizes, dtype=np.int64))
