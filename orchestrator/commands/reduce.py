"""`ncc reduce MODEL (--test SCRIPT | --workdir WORKDIR [--job NAME]) --output REDUCED.hlo`.

Shrinks an HLO module while it stays interesting: while `SCRIPT FILE.hlo` exits 0, or while its
compile fails in the same job with the same signature as the failed compile of WORKDIR (replayed
with that compile's flags and allow-listed environment). Prints each step, then the instructions
before and after, the steps, the candidates tried and the time; writes the smallest module as HLO
text (REDUCED.hlo) and as a serialized HloModuleProto (REDUCED.hlo.pb), each atomically. Candidates
run in parallel, `--jobs` at once (default: the cores this process may use). Bad input is one
U-code line; a module that is not interesting to begin with is [U017]. Ctrl-C stops the tests and
writes the smallest interesting module found so far before the [U007] line. The reduction is in
ncc.orchestrator.triage.reduce (the loop), reduce_edits (the candidates) and interestingness (the tests).
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import sys
import tempfile
import time
from pathlib import Path

from ncc.orchestrator import Stopped, stop_like_ctrl_c
from ncc.orchestrator.commands.compile import positive_float, positive_int
from ncc.orchestrator.diagnostics import NccError, printable
from ncc.orchestrator.outputs import OutputError, check_writable, write_output
from ncc.orchestrator.triage.interestingness import CompileTest, compile_test, script_test
from ncc.orchestrator.triage.reduce import Reducer
from ncc.orchestrator.triage.reduce_edits import instruction_count
from ncc.schemas import hlo_pb2
from ncc.tools.common.errors import CompileError
from ncc.tools.hlo.hlo_printer import print_module
from ncc.tools.hlo.hlo_reader import load_module
from ncc.tools.hlo.hlo_verify import verify_module

MIN_CANDIDATE_TIMEOUT_S = 60.0  # a candidate's test may take this long, or 10x the original's test
FIRST_TEST_TIMEOUT_S = 3600.0


def _cores() -> int:
    try:
        return len(os.sched_getaffinity(0))
    except (AttributeError, OSError):
        return os.cpu_count() or 1


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("model", type=Path, help="the HLO module to reduce (.hlo or .hlo.pb)")
    how = parser.add_mutually_exclusive_group(required=True)
    how.add_argument(
        "--test", type=Path, metavar="SCRIPT", help="interesting while `SCRIPT FILE.hlo` exits 0"
    )
    how.add_argument(
        "--workdir",
        type=Path,
        metavar="WORKDIR",
        help="interesting while the compile fails in the same job with the same signature as WORKDIR's",
    )
    parser.add_argument("--job", metavar="NAME", help="with --workdir: the job that must fail (checked)")
    parser.add_argument(
        "--output",
        "-o",
        type=Path,
        required=True,
        metavar="REDUCED.hlo",
        help="the reduced module as HLO text; REDUCED.hlo.pb gets it as a serialized HloModuleProto",
    )
    parser.add_argument(
        "--jobs",
        "-j",
        type=positive_int,
        default=_cores(),
        metavar="N",
        help="candidates tested at once (default: the cores ncc may use)",
    )
    parser.add_argument(
        "--candidate-timeout",
        type=positive_float,
        metavar="S",
        help=f"stop a candidate's test after S seconds (default: 10x the original's, at least "
        f"{MIN_CANDIDATE_TIMEOUT_S:g})",
    )
    parser.add_argument("--json", action="store_true", help="print one JSON object (progress goes to stderr)")


def output_paths(output: Path) -> tuple[Path, Path]:
    """REDUCED.hlo -> (REDUCED.hlo, REDUCED.hlo.pb); REDUCED.hlo.pb -> (REDUCED.hlo, REDUCED.hlo.pb)."""
    output = Path(os.path.abspath(output))
    if output.name.lower().endswith(".hlo.pb") and len(output.name) > len(".hlo.pb"):
        return output.with_name(output.name[: -len(".pb")]), output
    return output, output.with_name(output.name + ".pb")


def _check_outputs(paths: tuple[Path, ...], keep: dict[str, Path | None]) -> None:
    """Refuse outputs that cannot be written, or that would overwrite a file `keep` names (the
    model, the test script: what a reduction reads)."""
    for path in paths:
        if path.exists() and not path.is_file():
            raise NccError.of(
                "U002",
                f"-o names {path}, which is not a regular file (reduce writes the module as two "
                "files, .hlo and .hlo.pb)",
            )
        for what, kept in keep.items():
            if kept is not None and path.exists() and kept.is_file() and os.path.samefile(path, kept):
                raise NccError.of("U002", f"-o would overwrite {what} {kept} with the reduced module")
        if not path.parent.is_dir():
            raise NccError.of("U004", f"the directory of the output does not exist: {path.parent}")
        try:
            check_writable(path)
        except OutputError as err:
            raise NccError.of("U005", f"cannot write output {path}: {err}") from None


def _load(model: Path) -> hlo_pb2.HloModuleProto:
    if not model.exists():
        raise NccError.of("U001", f"model file not found: {model}")
    try:
        module = load_module(str(model))
        verify_module(module)
    except CompileError as err:
        raise NccError.of(
            "U018", f"{model} is not a module ncc reduce can start from: [{err.code}] {err.message}"
        ) from None
    return module


def _write(module: hlo_pb2.HloModuleProto, text: Path, proto: Path) -> None:
    try:
        write_output(proto, data=module.SerializeToString())
        write_output(text, data=print_module(module).encode("utf-8"))
    except OutputError as err:
        raise NccError.of("U005", f"cannot write the reduced module: {err}") from None


def _scratch(directory: Path) -> Path:
    try:
        return Path(tempfile.mkdtemp(prefix=".ncc-reduce-", dir=directory))
    except OSError as err:
        reason = err.strerror or str(err)
        raise NccError.of("U005", f"cannot make a scratch folder in {directory}: {reason}") from None


def run(args: argparse.Namespace) -> int:
    stop_like_ctrl_c()
    started = time.monotonic()
    model = Path(os.path.abspath(args.model))
    if args.job is not None and args.workdir is None:
        raise NccError.of("U002", "--job NAME goes with --workdir WORKDIR (the job that failed there)")
    text_out, proto_out = output_paths(args.output)
    twin = next(path for path in output_paths(model) if path != model)  # X.hlo <-> X.hlo.pb
    keep = {"the model": model, "the model's twin": twin, "the --test script": args.test}
    _check_outputs((text_out, proto_out), keep)
    module = _load(model)
    warnings: list[str] = []
    if args.test is not None:
        test = script_test(args.test, model)
    else:
        test, warnings = compile_test(args.workdir, model, args.job)
    for warning in warnings:
        print(f"ncc: warning: {printable(warning)}", file=sys.stderr)
    out = sys.stderr if args.json else sys.stdout

    def say(line: str) -> None:
        print(printable(line), file=out, flush=True)

    before = instruction_count(module), len(module.computations)
    say(f"ncc reduce: {model}: {before[0]} instructions in {before[1]} computations")
    say(f"ncc reduce: interesting while {test.describe()}")
    scratch = _scratch(text_out.parent)
    timeout = args.candidate_timeout or FIRST_TEST_TIMEOUT_S
    reducer = Reducer(test, module, scratch, args.jobs, timeout, log=say)
    try:
        if isinstance(test, CompileTest) or model.name.lower().endswith((".hlo", ".txt")):
            original = model.read_bytes()  # the model as given, byte for byte
            verdict, seconds = reducer.check_file(lambda path: path.write_bytes(original))
        else:
            verdict, seconds = reducer.check_file(lambda path: test.write(module, path))
        if not verdict.interesting:
            raise NccError.of("U017", f"{model} is not interesting to begin with: {verdict.detail}")
        if args.candidate_timeout is None:
            reducer.timeout = max(MIN_CANDIDATE_TIMEOUT_S, 10 * seconds)
        say(f"ncc reduce: the original is interesting ({seconds:.1f} s); {args.jobs} candidates at a time")
        try:
            reduced = reducer.reduce()
        except KeyboardInterrupt as stop:
            reducer.close()
            size = instruction_count(reducer.best)
            if size < before[0]:
                _write(reducer.best, text_out, proto_out)
                kept = f"; the smallest interesting module so far ({size} instructions) is in {text_out}"
            else:
                kept = ""
            how = f"stopped by {stop.signame}" if isinstance(stop, Stopped) else "interrupted"
            raise NccError.of("U007", f"reduction {how}{kept}") from None
        _write(reduced, text_out, proto_out)
    finally:
        reducer.close()
        shutil.rmtree(scratch, ignore_errors=True)
    after = instruction_count(reduced), len(reduced.computations)
    seconds = time.monotonic() - started
    stats = reducer.stats
    if args.json:
        report = {
            "model": str(model),
            "output": str(text_out),
            "output_proto": str(proto_out),
            "test": test.describe(),
            "instructions_before": before[0],
            "instructions_after": after[0],
            "computations_before": before[1],
            "computations_after": after[1],
            "seconds": round(seconds, 3),
            "jobs": args.jobs,
            **stats.to_json(),
        }
        print(json.dumps(report, indent=1, sort_keys=True))
        return 0
    say(
        f"ncc reduce: {before[0]} -> {after[0]} instructions, {before[1]} -> {after[1]} computations, "
        f"in {len(stats.steps)} steps and {seconds:.1f} s; {stats.tried} candidates tried "
        f"({stats.interesting} interesting, {stats.stopped} stopped early), {stats.invalid} invalid "
        f"and {stats.duplicates} repeated not tried"
    )
    say(f"ncc reduce: wrote {text_out} and {proto_out}")
    return 0
