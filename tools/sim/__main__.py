"""`ncc-sim`: execute a NEFF on golden inputs, check it, and report.

    ncc-sim --neff model.neff --inputs golden.pb [--expect golden.pb] [--output out.pb]
            [--report report.json] [--atol 1e-4] [--rtol 0] [--no-race-check] --diagnostics d.pb

`--inputs`/`--expect` are ncc.TensorSet files (tensors "arg*" are inputs, "out*" expected
outputs; one file may hold both). The report (JSON) and the outputs (TensorSet) are written
atomically before any verdict, so a failing run still leaves them to inspect. Verdicts, in
order: a deadlock is E612, a race E611 (naming the first and the count), an output that differs
from `--expect` beyond |got - expected| <= atol + rtol·max|expected| is E610 (with the max error).
"""

from __future__ import annotations

import argparse
import json
import sys
from dataclasses import dataclass

import numpy as np

from ncc.schemas import bir_pb2, common_pb2
from ncc.tools.common import dtypes
from ncc.tools.common.errors import CompileError
from ncc.tools.common.protoio import read_proto, write_bytes_atomic, write_proto
from ncc.tools.common.toolmain import run_tool
from ncc.tools.packager.neff import read_neff
from ncc.tools.sim.api import SimResult, simulate_neff


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="ncc-sim", description="Simulate a NEFF and check its outputs.")
    parser.add_argument("--neff", required=True, help="the NEFF file to execute")
    parser.add_argument("--inputs", required=True, help="TensorSet holding arg0..argN")
    parser.add_argument("--expect", help="TensorSet holding the expected out0..outN")
    parser.add_argument("--output", help="where to write the outputs (TensorSet)")
    parser.add_argument("--report", help="where to write the JSON report")
    parser.add_argument("--atol", type=float, default=1e-4, help="absolute tolerance (default 1e-4)")
    parser.add_argument(
        "--rtol",
        type=float,
        default=None,
        help="relative tolerance (default: 2^-7 when the program holds bf16 data, 2^-10 for f16, else 2e-4)",
    )
    parser.add_argument("--no-race-check", action="store_true", help="skip happens-before race detection")
    return parser


def _read_tensors(path: str, what: str, prefix: str) -> dict[str, np.ndarray]:
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


def _write_outputs(path: str, result: SimResult, neff: bir_pb2.Neff) -> None:
    dtype_of = {f"out{t.index}": t.dtype for t in neff.hbm if t.role == bir_pb2.OUTPUT}
    tensor_set = common_pb2.TensorSet()
    for name, array in result.outputs.items():
        dtype = dtype_of[name]
        tensor_set.tensors.append(
            dtypes.numpy_to_tensor(name, dtypes.user_array_to_storage(array, dtype), dtype)
        )
    write_proto(path, tensor_set)


def default_rtol(neff: bir_pb2.Neff) -> float:
    """Relative tolerance fitting the narrowest float in the program.

    The golden evaluator and the device sum in different orders; once a result is rounded to a
    16-bit float that difference can be one unit in the last place of that type. In fp32 it grows
    with chained reductions: the bundled transformer block (K = 1024 contractions, softmax, two
    residuals) differs from the golden by 5e-5 of its largest value, so fp32 allows 2e-4 of it;
    a wrong program is off by far more.
    """
    kinds = {tensor.dtype for tensor in neff.hbm}
    if common_pb2.BF16 in kinds:
        return 2.0**-7
    if common_pb2.F16 in kinds:
        return 2.0**-10
    return 2e-4


def body(args: argparse.Namespace) -> None:
    neff = read_neff(args.neff)
    if args.rtol is None:
        args.rtol = default_rtol(neff)
    inputs = _read_tensors(args.inputs, "inputs", "arg")
    result = simulate_neff(neff, inputs, check_races=not args.no_race_check)
    comparisons: list[Comparison] = []
    if args.expect:
        expected = _read_tensors(args.expect, "expected outputs", "out")
        comparisons = [
            compare(name, result.outputs.get(name), expected[name], args.atol, args.rtol)
            for name in sorted(expected)
        ]
    report = result.report()
    if args.expect:
        report["comparison"] = [
            {
                "name": c.name,
                "ok": c.ok,
                "max_abs_error": c.max_abs_error if np.isfinite(c.max_abs_error) else None,
                "mismatches": c.mismatches,
                "elements": c.elements,
                "worst": c.worst,
                "problem": c.problem,
            }
            for c in comparisons
        ]
        report["tolerance"] = {"atol": args.atol, "rtol": args.rtol}
    if args.report:
        write_bytes_atomic(args.report, (json.dumps(report, indent=2, sort_keys=True) + "\n").encode())
    if args.output:
        _write_outputs(args.output, result, neff)
    if result.deadlock:
        raise CompileError("E612", result.deadlock, neff.name)
    if result.races:
        count = max(result.race_count, len(result.races))
        raise CompileError("E611", f"{count} race(s); first: {result.races[0].describe()}", neff.name)
    for comparison in comparisons:
        if not comparison.ok:
            raise CompileError("E610", comparison.message(args.atol, args.rtol), comparison.name)


def main() -> None:
    sys.exit(run_tool("sim", build_parser(), body))


if __name__ == "__main__":
    main()
