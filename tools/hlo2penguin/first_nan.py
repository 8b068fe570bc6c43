"""An argmax's or argmin's index where its row holds several NaNs: the first one, as XLA:CPU's left fold
gives it, though the variadic reduce is a halving tree.

JAX reduces (value, index) pairs with a comparator that keeps its first operand when both values
are NaN. XLA leaves a reduction's order open, so that is order-dependent: XLA:CPU folds left to
right and returns the first NaN's index; the halving tree (`Lowering._reduce_tree`) pairs column
j with column j + w/2, and over [0, nan, nan, 0] returned 2, not 1. Where the reducer is such a
comparator (checked by folding it on scalars, control.py's folding: a NaN operand wins over a
number, and of two NaNs the first) and the index is an iota along the one reduced dimension, the
tree's index is replaced where its value is NaN by the least index of a NaN in the row: a min
over select(x != x, index, INT_MAX), which any order computes alike.

A mixin of Lowering (lower.py): its methods call the rest of the lowering through `self`.
"""

from __future__ import annotations

import numpy as np

from ncc.schemas import common_pb2, hlo_pb2
from ncc.tools.common.dtypes import is_float
from ncc.tools.hlo2penguin.trip_fold import root_id
from ncc.tools.hlo2penguin.values import Splat, Value, is_integer


class FirstNanOps:
    def _keeps_first_nan(self, instr, reducer: hlo_pb2.HloComputationProto, inputs: list[Value],
                         inits: list[Value], reduced: list[int]) -> bool:
        """Whether `instr` is an argmax/argmin-like reduce whose left fold returns the first NaN's
        index (the module docstring)."""
        if len(inputs) != 2 or len(reduced) != 1:
            return False
        values, index = inputs
        if not is_float(values.dtype) or not is_integer(index.dtype):
            return False
        init_value = inits[0]
        if not isinstance(init_value, Splat) or np.isnan(init_value.value):
            return False
        if self._iota_dimension(instr.operand_ids[1]) != reduced[0]:
            return False
        nan = np.float32("nan")

        def fold(first: tuple[float, int], second: tuple[float, int]) -> tuple[float, int] | None:
            args = [np.array([first[0]], np.float32), np.array([first[1]], np.int64),
                    np.array([second[0]], np.float32), np.array([second[1]], np.int64)]
            result = self._fold_values(reducer, args)[root_id(reducer)]
            if not isinstance(result, tuple) or len(result) != 2 or any(r is None for r in result):
                return None
            return float(result[0].reshape(-1)[0]), int(result[1].reshape(-1)[0])

        def is_nan_at(result: tuple[float, int] | None, index_value: int) -> bool:
            return result is not None and np.isnan(result[0]) and result[1] == index_value

        return (is_nan_at(fold((nan, 1), (nan, 0)), 1) and is_nan_at(fold((nan, 0), (nan, 1)), 0)
                and is_nan_at(fold((0.0, 5), (nan, 7)), 7))

    def _iota_dimension(self, operand: int) -> int | None:
        """The dimension an iota (or a broadcast of one, as JAX writes a 2-D argmax's index)
        counts along, or None for any other operand."""
        instr = self.instructions.get(operand)
        if instr is not None and instr.opcode == "broadcast" and len(instr.operand_ids) == 1:
            inner = self._iota_dimension(instr.operand_ids[0])
            return None if inner is None else int(instr.dimensions[inner])
        if instr is None or instr.opcode != "iota" or not instr.dimensions:
            return None
        return int(instr.dimensions[0])

    def _first_nan_index(self, instr, columns: list[Value], results: list[Value]) -> Value:
        """The tree's index (results[1], shape [kept..., 1]) where its value is a number, else the
        least index of a NaN in the row (`columns`: the values and the index as [kept..., width])."""
        values, index = columns
        shape, one, dtype = values.shape, results[0].shape, index.dtype
        pred = common_pb2.PRED
        nan = self._synthetic(instr, "compare", [values, values], shape, pred, comparison_direction="NE")
        beyond = Splat(float(np.iinfo(np.int32).max), dtype, shape)
        candidates = self._synthetic(instr, "select", [nan, index, beyond], shape, dtype)

        def least(first: list[Value], second: list[Value], at: tuple[int, ...]) -> list[Value]:
            return [self._synthetic(instr, "minimum", [first[0], second[0]], at, dtype)]

        first_nan = self._halving(instr, [candidates], least)[0]
        found = self._synthetic(instr, "compare", [results[0], results[0]], one, pred,
                                comparison_direction="NE")
        return self._synthetic(instr, "select", [found, first_nan, results[1]], one, dtype)
