"""`ncc run FILE.neff --inputs IN.npz --output OUT.npz [--report F.json] [--trace F.json] [--inferences N]
[--max-steps N]`.

Runs the NEFF on the simulator (ncc.tools.sim.api, the simulator's public API) with the arrays
arg0..argN of IN.npz, writes out0..outM to OUT.npz and prints the simulated time. If IN.npz also
holds reference outputs (out0.., as the models' NAME.io.npz do), the report says how far the
NEFF's outputs are from them. `--inferences N` runs it N times back to back, as a
runtime serving requests does: memory and semaphore counts carry over, so a NEFF whose semaphores
are not reset at the end races in its second inference (the trace shows the first). A race, a
deadlock, or semaphores left above 0 at the end of an inference are failed checks:
[R001]/[R002]/[R003], exit 5,
after the outputs, the report and the trace were written so they can be inspected. `--trace`
writes the simulated schedule in Chrome Trace Event Format (open it in ui.perfetto.dev or
chrome://tracing): a track per engine and per DMA queue, each instruction a slice, semaphore
stalls as "wait" slices (ncc.tools.sim.trace); without it nothing is recorded. `--max-steps N`
is the most instructions the run may execute, over all its inferences (loops counted before
anything runs, so a hostile trip count or inference count is [E605] at once; default
ncc.tools.sim.limits.MAX_STEPS, 20 million).

Every file written (--output, --report, --trace) is checked before the simulation runs: its
directory exists [U004], it is not a directory and not one of the files read or another output
[U002], and its directory is writable [U005]; each is written atomically.
"""

from __future__ import annotations

import argparse
import hashlib
import io
import json
import os
import sys
import time
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from ncc.orchestrator.config import THREAD_POOL_ENV
from ncc.orchestrator.diagnostics import ExitCode, NccDiagnostic, NccError, require_file
from ncc.orchestrator.inputs import load_inputs
from ncc.orchestrator.outputs import OutputError, check_writable, is_stream, write_output
from ncc.orchestrator.versions import ncc_version


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("neff", type=Path, help="the NEFF to execute")
    parser.add_argument("--inputs", type=Path, required=True, metavar="IN.npz", help="arrays arg0..argN")
    parser.add_argument(
        "--output", type=Path, required=True, metavar="OUT.npz", help="where to write out0..outM"
    )
    parser.add_argument(
        "--report", type=Path, metavar="FILE.json", help="write the simulation report as JSON"
    )
    parser.add_argument(
        "--inferences",
        type=_positive,
        default=1,
        metavar="N",
        help="run the NEFF N times back to back, memory and semaphores carried over (default 1)",
    )
    parser.add_argument(
        "--max-steps",
        type=_positive,
        default=None,
        metavar="N",
        help="refuse a run that would execute more than N instructions, all inferences together [E605] "
        "(default 20,000,000)",
    )
    parser.add_argument(
        "--trace",
        type=Path,
        metavar="FILE.json",
        help="write the simulated schedule as a Chrome Trace Event Format file (Perfetto, chrome://tracing)",
    )


def _positive(text: str) -> int:
    try:
        value = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"not a whole number: {text!r}") from None
    if value < 1:
        raise argparse.ArgumentTypeError(f"must be at least 1, got {value}")
    return value


def _outputs(args: argparse.Namespace) -> list[tuple[str, Path]]:
    named = (("--output", args.output), ("--report", args.report), ("--trace", args.trace))
    return [(flag, path) for flag, path in named if path is not None]


def _check_paths(args: argparse.Namespace) -> None:
    for path, what in ((args.neff, "NEFF"), (args.inputs, "inputs")):
        require_file(path, what)
    taken = {args.neff.resolve(): "the NEFF", args.inputs.resolve(): "the inputs"}
    for flag, path in _outputs(args):
        if not path.absolute().parent.is_dir():
            raise NccError.of("U004", f"the directory of {path} does not exist")
        if path.is_dir():
            raise NccError.of("U002", f"{flag} names a directory, not a file: {path}")
        if path.resolve() in taken and not is_stream(path):
            raise NccError.of("U002", f"{flag} {path} is {taken[path.resolve()]}: it would be overwritten")
        taken[path.resolve()] = f"the {flag} file"
        try:
            check_writable(path)
        except OutputError as err:
            raise NccError.of("U005", f"cannot write {flag} {path}: {err}") from None


def _write(flag: str, path: Path, data: bytes) -> None:
    """Write one output all or nothing (outputs.py); a failure (disk full, a directory appeared) is [U005]."""
    try:
        write_output(path, data=data)
    except OutputError as err:
        raise NccError.of("U005", f"cannot write {flag} {path}: {err}") from None


def compare_with_reference(outputs: dict[str, Any], reference: dict[str, Any]) -> list[dict[str, Any]]:
    """Max abs error of each output against a same-named reference array, if any, measured as the
    simulator's check does (NaN matches NaN and an infinity matches itself; integers exactly)."""
    import numpy as np

    from ncc.tools.sim.check import compare

    rows = []
    for name in sorted(set(outputs) & set(reference)):
        result = compare(name, np.asarray(outputs[name]), np.asarray(reference[name]), atol=0.0, rtol=0.0)
        error = None if result.problem else result.max_abs_error
        rows.append({"name": name, "max_abs_error": error, "detail": result.problem})
    return rows


def _compile_error(err: Exception) -> NccError:
    """A tool's CompileError (a bad NEFF, mismatched inputs) as a driver diagnostic, exit 1."""
    message = str(getattr(err, "message", err))
    location = str(getattr(err, "location", ""))
    return NccError(
        NccDiagnostic(
            str(getattr(err, "code", "E000")), message, location="" if location in message else location
        )
    )


def schedule_quality(simulated_ns: float, metadata: Mapping[str, str]) -> dict[str, float]:
    """Makespan over the compiler's lower bound (max of busiest engine, critical path, DMA time)."""
    try:
        bound = float(metadata["walrus.lower_bound_ns"])
    except (KeyError, ValueError):
        return {}  # compiled with a pass list that did not schedule
    if bound <= 0:
        return {}
    return {"lower_bound_ns": bound, "makespan_over_lower_bound": simulated_ns / bound}


def _single_threaded_math() -> None:
    """One BLAS thread for the simulation (unless the user chose a pool size). The simulator is one
    Python thread whose matmuls are single tiles (at most 128 x 128 x 512): a thread pool only
    hands each one back and forth, and with other jobs on the cores its spinning threads cost ten
    times the work (a 128 x 128 x 64 matmul: 190 us pooled, 20 us on one thread, measured on 2
    busy cores). Set before numpy is first imported, which is when BLAS reads it."""
    for name in THREAD_POOL_ENV:
        os.environ.setdefault(name, "1")


def run(args: argparse.Namespace) -> int:
    _check_paths(args)
    _single_threaded_math()
    import numpy as np

    from ncc.schemas import bir_pb2
    from ncc.tools.common import dtypes
    from ncc.tools.common.errors import CompileError
    from ncc.tools.packager.neff import read_neff
    from ncc.tools.sim.api import chrome_trace, simulate_neff

    inputs, reference, others = load_inputs(args.inputs)
    try:
        neff = read_neff(args.neff)
    except CompileError as err:
        raise _compile_error(err) from None
    expected = {f"arg{t.index}" for t in neff.hbm if t.role == bir_pb2.INPUT}
    ignored = others + sorted(set(inputs) - expected)
    if ignored:
        names = ", ".join(ignored)
        warning = f"ncc: warning: {args.inputs} holds arrays the NEFF does not take, ignored: {names}"
        print(warning, file=sys.stderr)
    for tensor in neff.hbm:
        given = inputs.get(f"arg{tensor.index}") if tensor.role == bir_pb2.INPUT else None
        lossy = dtypes.lossy_integer_input(given, tensor.dtype) if given is not None else ""
        if lossy:
            print(
                f"ncc: warning: input arg{tensor.index} ({given.dtype}) has {lossy} for the NEFF's "
                f"{dtypes.name(tensor.dtype)} parameter: converted as XLA converts, it is not what was "
                "given",
                file=sys.stderr,
            )
    started = time.monotonic()
    steps = {} if args.max_steps is None else {"max_steps": args.max_steps}
    try:
        result = simulate_neff(
            neff, inputs, record_schedule=args.trace is not None, inferences=args.inferences, **steps
        )
    except CompileError as err:
        if err.code == "E605":
            err.message += "; --max-steps N raises the limit"
        raise _compile_error(err) from None
    wall = time.monotonic() - started

    arrays = io.BytesIO()
    np.savez(arrays, **result.outputs)
    _write("--output", args.output, arrays.getvalue())
    report = {
        **result.report(),
        "neff": str(args.neff),
        "neff_sha256": hashlib.sha256(args.neff.read_bytes()).hexdigest(),
        "name": neff.name,
        "target": neff.target,
        "metadata": dict(neff.metadata),
        "inputs": str(args.inputs),
        "output": str(args.output),
        **({"trace": str(args.trace)} if args.trace else {}),
        "reference_comparison": compare_with_reference(result.outputs, reference),
        **schedule_quality(result.simulated_ns, neff.metadata),
        "host_wall_s": wall,
        "ncc_version": ncc_version(),
    }
    if args.report:
        _write("--report", args.report, json.dumps(report, indent=1).encode() + b"\n")
    if args.trace and result.schedule is not None:
        about = {
            "neff": str(args.neff),
            "name": neff.name,
            "target": neff.target,
            "ncc_version": ncc_version(),
        }
        trace = chrome_trace(result.schedule, about)
        _write("--trace", args.trace, json.dumps(trace, separators=(",", ":")).encode() + b"\n")

    names = ", ".join(result.outputs) or "none"
    bound = ""
    if "makespan_over_lower_bound" in report:
        ratio, lower = report["makespan_over_lower_bound"], report["lower_bound_ns"]
        bound = f" = {ratio:.2f} x the lower bound {lower:.0f} ns"
    each = f" (the first of {args.inferences} inferences)" if args.inferences > 1 else ""
    over = f" over the {args.inferences}" if args.inferences > 1 else ""
    simulated = f"{result.simulated_ns:.0f} ns ({result.simulated_ns / 1000:.3f} us){each}"
    print(
        f"ncc: simulated time {simulated}{bound}, "
        f"{result.instruction_count} instructions{over}; outputs {names} -> {args.output}"
    )
    if args.trace:
        print(f"ncc: schedule trace -> {args.trace} (open it in ui.perfetto.dev or chrome://tracing)")
    for row in report["reference_comparison"]:
        if row["max_abs_error"] is not None:
            error = row["max_abs_error"]
            print(f"ncc: {row['name']}: max |error| vs the reference in {args.inputs.name}: {error:.3g}")
        elif row["detail"]:
            detail = row["detail"]
            print(f"ncc: {row['name']}: not compared with the reference in {args.inputs.name}: {detail}")
    where = {"log": args.report} if args.report else {}
    if result.deadlock:
        raise NccError.of("R002", f"deadlock while running {args.neff}: {result.deadlock}", **where)
    if result.races:
        count = max(getattr(result, "race_count", 0), len(result.races))
        count_text = f"at least {count}" if getattr(result, "races_capped", False) else str(count)
        raise NccError.of(
            "R001", f"{count_text} data race(s) in {args.neff}; first: {result.races[0].describe()}", **where
        )
    if result.unreset_semaphores:
        left = ", ".join(f"s{s}={c}" for s, c in sorted(result.unreset_semaphores.items()))
        raise NccError.of(
            "R003",
            f"{args.neff} ends an inference with semaphores not reset ({left}): "
            "the next inference's waits would pass before their producers ran",
            **where,
        )
    return int(ExitCode.OK)
