"""ncc-walrus-driver: run a named list of backend passes over a BIR program in one process.

  ncc-walrus-driver --input bir.pb --output program.pb [--walrus-passes a,b{k=v},c] [--optlevel N]
                    [--target trn1] [--stats stats.json] [--print-ir-after P|all] [--timing]
                    [--verify-each] [--crash-reproducer PATH] [--list-passes] [--print-pipeline]
                    --diagnostics d.pb

Without --walrus-passes the pass list is default_pipeline(--optlevel); --print-pipeline prints
it (as text, one line: what `ncc bisect` cuts into prefixes) and exits. Exit codes as every stage
tool (tools/common/toolmain.py): 0 ok, 1 compile error with a Diagnostic written, 2 usage.
"""

from __future__ import annotations

import argparse
import json
from typing import Any

from ncc.schemas import bir_pb2
from ncc.tools.common.errors import CompileError
from ncc.tools.common.protoio import read_proto, write_bytes_atomic, write_proto
from ncc.tools.common.toolmain import exit_now, run_tool
from ncc.tools.target import Target, load_target
from ncc.tools.walrus_driver.context import PassContext
from ncc.tools.walrus_driver.pass_manager import Instruments, PassManager, default_pipeline, parse_pipeline
from ncc.tools.walrus_driver.registry import load_passes

TOOL = "walrus_driver"


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="ncc-walrus-driver", description=__doc__.splitlines()[0])
    parser.add_argument("--input", help="BIR Program (.pb) from the frontend")
    parser.add_argument("--output", help="where to write the compiled BIR Program (.pb)")
    parser.add_argument("--walrus-passes", help="comma-separated pass list (default: by --optlevel)")
    parser.add_argument("--optlevel", type=int, default=2, choices=range(4), help="0..3 (default 2)")
    parser.add_argument("--target", help="target name or JSON path (default: the program's, else trn1)")
    parser.add_argument("--stats", help="write every pass's counters and wall time to this JSON file")
    parser.add_argument(
        "--print-ir-after",
        action="append",
        default=[],
        metavar="PASS",
        help="print the IR to stderr after this pass (repeatable; 'all' for every pass)",
    )
    parser.add_argument("--timing", action="store_true", help="print per-pass wall time to stderr")
    parser.add_argument("--verify-each", action="store_true", help="run birverifier after every pass")
    parser.add_argument(
        "--crash-reproducer",
        metavar="PATH",
        help="on a compile error, write the input program here and the pipeline to PATH.txt",
    )
    parser.add_argument("--list-passes", action="store_true", help="list the registered passes and exit")
    parser.add_argument(
        "--print-pipeline",
        action="store_true",
        help="print the pass list these flags run (--walrus-passes, or --optlevel's) and exit",
    )
    return parser


def resolve_target(name: str) -> Target:
    try:
        return load_target(name)
    except (OSError, KeyError, ValueError) as err:
        raise CompileError("E400", f"cannot load target {name!r}: {err}", name) from None


def prepare(
    program: bir_pb2.Program,
    passes: str | list[str] | None = None,
    optlevel: int = 2,
    target: Target | str | None = None,
    instruments: Instruments | None = None,
) -> tuple[PassContext, PassManager]:
    """Validate the pass list and build the context for `program` (nothing runs yet)."""
    pipeline = passes if passes is not None else default_pipeline(optlevel)
    manager = PassManager(parse_pipeline(pipeline) if isinstance(pipeline, str) else pipeline, instruments)
    if not isinstance(target, Target):
        target = resolve_target(target or program.target or "trn1")
    program.target = target.name
    return PassContext.for_program(program, target), manager


def compile_program(
    program: bir_pb2.Program,
    passes: str | list[str] | None = None,
    optlevel: int = 2,
    target: Target | str | None = None,
    instruments: Instruments | None = None,
) -> tuple[PassContext, PassManager]:
    """Run the pass list over `program` in place; returns the context and the manager (for stats)."""
    ctx, manager = prepare(program, passes, optlevel, target, instruments)
    manager.run(ctx)
    program.attributes["walrus.pipeline"] = manager.pipeline_text()
    return ctx, manager


def _list_passes() -> None:
    for name, info in sorted(load_passes().items()):
        print(f"{name:28s} {info.summary}")


def body(args: argparse.Namespace) -> None:
    if args.list_passes:
        _list_passes()
        return
    if args.print_pipeline:
        passes = args.walrus_passes if args.walrus_passes is not None else default_pipeline(args.optlevel)
        print(PassManager(parse_pipeline(passes) if isinstance(passes, str) else passes).pipeline_text())
        return
    if not args.input or not args.output:
        build_parser().error("--input and --output are required (unless --list-passes or --print-pipeline)")
    instruments = Instruments(
        print_ir_after=set(args.print_ir_after),
        timing=args.timing,
        verify_each=args.verify_each,
        as_tool=TOOL,  # one stderr line per pass start (what `ncc triage` reads), pass-level faults
    )
    program = read_proto(args.input, bir_pb2.Program, "BIR program")
    ctx, manager = prepare(program, args.walrus_passes, args.optlevel, args.target, instruments)
    target = ctx.target
    try:
        manager.run(ctx)
    except CompileError as err:
        if args.stats:
            _write_stats(args.stats, manager.report(ctx) | {"failed": err.one_line()})
        if args.crash_reproducer and ctx.input_program is not None:
            write_proto(args.crash_reproducer, ctx.input_program)
            command = (
                f"ncc-walrus-driver --input {args.crash_reproducer} --output OUT.pb --target {target.name} "
                f"--walrus-passes '{manager.pipeline_text()}' --verify-each\n"
            )
            write_bytes_atomic(args.crash_reproducer + ".txt", (f"# {err.one_line()}\n" + command).encode())
        raise
    program.attributes["walrus.pipeline"] = manager.pipeline_text()
    write_proto(args.output, program)
    if args.stats:
        _write_stats(args.stats, manager.report(ctx))


def _write_stats(path: str, report: dict[str, Any]) -> None:
    write_bytes_atomic(path, (json.dumps(report, indent=2, sort_keys=False) + "\n").encode())


def main() -> None:
    exit_now(run_tool(TOOL, build_parser(), body))


if __name__ == "__main__":
    main()
