"""`ncc-sim`: execute a NEFF on golden inputs, check it, and report.

    ncc-sim --neff model.neff --inputs golden.pb [--expect golden.pb] [--output out.pb]
            [--report report.json] [--atol 1e-4] [--rtol 0] [--no-race-check] [--max-steps N]
            --diagnostics d.pb

`--inputs`/`--expect` are ncc.TensorSet files (tensors "arg*" are inputs, "out*" expected
outputs; one file may hold both). The report (JSON) and the outputs (TensorSet) are written
atomically before any verdict, so a failing run still leaves them to inspect. Verdicts, in
order: a deadlock is E612, a race E611 (naming the first and the count), an output that differs
from `--expect` beyond |got - expected| <= atol + rtol·max|expected| is E610 (with the max error),
semaphores left above 0 at the end of an inference (a NEFF that cannot run twice) E613.
`--inferences N` runs the NEFF N times back to back with memory and semaphores carried over;
`--max-steps N` refuses (E605) a run that would execute more than N instructions over all its inferences.
"""

from __future__ import annotations

import argparse
import json

import numpy as np

from ncc.schemas import bir_pb2, common_pb2
from ncc.tools.common import dtypes
from ncc.tools.common.errors import CompileError
from ncc.tools.common.protoio import write_bytes_atomic, write_proto
from ncc.tools.common.toolmain import exit_now, run_tool
from ncc.tools.packager.neff import read_neff
from ncc.tools.sim.api import SimResult, simulate_neff
from ncc.tools.sim.check import ATOL, Comparison, compare, default_rtol, read_tensors
from ncc.tools.sim.limits import MAX_STEPS

__all__ = ["Comparison", "compare", "default_rtol", "main"]


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="ncc-sim", description="Simulate a NEFF and check its outputs.")
    parser.add_argument("--neff", required=True, help="the NEFF file to execute")
    parser.add_argument("--inputs", required=True, help="TensorSet holding arg0..argN")
    parser.add_argument("--expect", help="TensorSet holding the expected out0..outN")
    parser.add_argument("--output", help="where to write the outputs (TensorSet)")
    parser.add_argument("--report", help="where to write the JSON report")
    parser.add_argument("--atol", type=float, default=ATOL, help=f"absolute tolerance (default {ATOL:g})")
    parser.add_argument(
        "--rtol",
        type=float,
        default=None,
        help="relative tolerance (default: 2^-7 when the program holds bf16 data, 2^-10 for f16, else 2e-4)",
    )
    parser.add_argument(
        "--inferences", type=int, default=1, help="run the NEFF this many times back to back (default 1)"
    )
    parser.add_argument("--no-race-check", action="store_true", help="skip happens-before race detection")
    parser.add_argument(
        "--max-steps",
        type=int,
        default=MAX_STEPS,
        help=f"refuse a NEFF that would execute more instructions (default {MAX_STEPS:,})",
    )
    return parser


def _write_outputs(path: str, result: SimResult, neff: bir_pb2.Neff) -> None:
    dtype_of = {f"out{t.index}": t.dtype for t in neff.hbm if t.role == bir_pb2.OUTPUT}
    tensor_set = common_pb2.TensorSet()
    for name, array in result.outputs.items():
        dtype = dtype_of[name]
        tensor_set.tensors.append(
            dtypes.numpy_to_tensor(name, dtypes.user_array_to_storage(array, dtype), dtype)
        )
    write_proto(path, tensor_set)


def body(args: argparse.Namespace) -> None:
    neff = read_neff(args.neff)
    if args.rtol is None:
        args.rtol = default_rtol(neff)
    inputs = read_tensors(args.inputs, "inputs", "arg")
    result = simulate_neff(
        neff, inputs, check_races=not args.no_race_check, inferences=args.inferences, max_steps=args.max_steps
    )
    comparisons: list[Comparison] = []
    if args.expect:
        expected = read_tensors(args.expect, "expected outputs", "out")
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
    if result.unreset_semaphores:
        left = ", ".join(f"s{s}={c}" for s, c in sorted(result.unreset_semaphores.items()))
        raise CompileError(
            "E613",
            f"the inference ends with semaphores not reset ({left}): the next one's waits would pass early",
            neff.name,
        )


def main() -> None:
    exit_now(run_tool("sim", build_parser(), body))


if __name__ == "__main__":
    main()
