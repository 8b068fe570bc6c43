"""Checking simulated outputs against expected ones: the tolerance rule of `--verify`.

Shared by `ncc-sim --expect` (the NeffVerifier job) and bir_sim's golden mode (what `ncc bisect`
runs after each prefix of the pipeline), so that both judge "matches the golden output" alike:
|got - expected| <= atol + rtol·max|expected| for floats, exact for integers and predicates.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from ncc.schemas import bir_pb2, common_pb2
from ncc.tools.common import dtypes
from ncc.tools.common.errors import CompileError
from ncc.tools.common.protoio import read_proto

ATOL = 1e-4  # the absolute part of the tolerance (`ncc-sim --atol`)


def read_tensors(path: str, what: str, prefix: str) -> dict[str, np.ndarray]:
    """The tensors of a TensorSet file whose names start with `prefix` ("arg", "out"), as user arrays."""
    tensor_set = read_proto(path, common_pb2.TensorSet, what)
    arrays = {}
    for tensor in tensor_set.tensors:
        if not tensor.name.startswith(prefix):
            continue
        try:
            arrays[tensor.name] = dtypes.storage_to_user_array(dtypes.tensor_to_numpy(tensor), tensor.dtype)
        except (KeyError, ValueError) as err:
            raise CompileError(
                "E602", f"{what} tensor {tensor.name!r} cannot be decoded: {err}", path
            ) from None
    return arrays


@dataclass
class Comparison:
    """One expected output checked against the simulated one."""

    name: str
    max_abs_error: float
    mismatches: int
    elements: int
    worst: str = ""  # where the worst out-of-tolerance element is, with both values
    problem: str = ""  # a structural failure: missing output or wrong shape
    exact: bool = False  # an integer or pred output: compared without tolerance

    @property
    def ok(self) -> bool:
        return not self.problem and self.mismatches == 0

    def message(self, atol: float, rtol: float) -> str:
        if self.problem:
            return f"output {self.name}: {self.problem}"
        if self.exact:
            return (
                f"output {self.name} differs from the expected integers ({self.mismatches} of "
                f"{self.elements} elements differ; first {self.worst})"
            )
        return (
            f"output {self.name} differs from the expected values: max abs error {self.max_abs_error:.6g} "
            f"exceeds tolerance atol={atol:g} rtol={rtol:g} ({self.mismatches} of {self.elements} elements "
            f"out of tolerance; worst {self.worst})"
        )


def compare(name: str, got: np.ndarray | None, expected: np.ndarray, atol: float, rtol: float) -> Comparison:
    """Element-wise |got - expected| <= atol + rtol·max|expected| (NaN matches NaN, inf matches inf).

    Integer and pred outputs compare exactly: a tolerance would hide a wrong integer (an s32 dot
    computed in fp32 is off by one at 16785409).

    The relative part scales with the output's largest finite magnitude, not each element's: a
    sum's rounding error grows with the magnitudes summed, and a result that cancelled to near
    zero keeps the error of its large terms.
    """
    if got is None:
        return Comparison(
            name, float("inf"), expected.size, expected.size, problem="the program has no such output"
        )
    if got.shape != expected.shape:
        return Comparison(
            name,
            float("inf"),
            expected.size,
            expected.size,
            problem=f"shape {list(got.shape)} but expected {list(expected.shape)}",
        )
    if not np.issubdtype(expected.dtype, np.floating):
        return _compare_exact(name, got, expected)
    a = got.astype(np.float64)
    b = expected.astype(np.float64)
    with np.errstate(invalid="ignore"):
        error = np.abs(a - b)
        same = (a == b) | (np.isnan(a) & np.isnan(b))
        error = np.where(same, 0.0, error)
        error = np.where(np.isnan(error), np.inf, error)
        finite = np.abs(b[np.isfinite(b)])
        scale = float(finite.max()) if finite.size else 0.0
        bad = error > atol + rtol * scale
    worst = float(error.max()) if error.size else 0.0
    where = ""
    if bad.any():
        index = np.unravel_index(int(np.argmax(np.where(bad, error, -1.0))), bad.shape)
        position = tuple(int(i) for i in index)
        where = f"at index {position}: got {float(a[index]):.9g}, expected {float(b[index]):.9g}"
    return Comparison(name, worst, int(bad.sum()), int(expected.size), worst=where)


def _compare_exact(name: str, got: np.ndarray, expected: np.ndarray) -> Comparison:
    """Integers and predicates have one right answer: any difference is a mismatch, whatever the tolerance."""
    wrong = got != expected
    count = int(wrong.sum())
    if not count:
        return Comparison(name, 0.0, 0, int(expected.size), exact=True)
    index = tuple(int(i) for i in np.unravel_index(int(np.argmax(wrong)), wrong.shape))
    error = np.abs(got[wrong].astype(object) - expected[wrong].astype(object))  # no int64 overflow
    where = f"at index {index}: got {got[index]}, expected {expected[index]}"
    return Comparison(name, float(max(error)), count, int(expected.size), worst=where, exact=True)


def default_rtol(program: bir_pb2.Neff | bir_pb2.Program) -> float:
    """Relative tolerance fitting the narrowest float in the program.

    The golden evaluator and the device sum in different orders; once a result is rounded to a
    16-bit float that difference can be one unit in the last place of that type. In fp32 it grows
    with chained reductions: the bundled transformer block (K = 1024 contractions, softmax, two
    residuals) differs from the golden by 5e-5 of its largest value, so fp32 allows 2e-4 of it;
    a wrong program is off by far more. Every float the program computes in counts, on chip too:
    f32 weights cast to bf16 for a matmul round each operand there (a 2-layer GRU so compiled
    differs from the golden by 5.7e-4 of an f32 output, which a bf16 rounding explains).
    """
    kinds = {tensor.dtype for tensor in program.hbm}
    instructions = [i for stream in program.streams for i in stream.instructions]
    if isinstance(program, bir_pb2.Program):
        instructions += list(program.instructions)
    kinds.update(ap.dtype for i in instructions for ap in (*i.inputs, *i.outputs))
    if common_pb2.BF16 in kinds:
        return 2.0**-7
    if common_pb2.F16 in kinds:
        return 2.0**-10
    return 2e-4
