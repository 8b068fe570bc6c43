"""The entry point every stage tool shares: argument parsing, diagnostics and fault injection.

Exit codes (the contract with the orchestrator, docs/diagnostics.md):
  0  success; outputs written atomically.
  1  a CompileError: a Diagnostic proto was written to --diagnostics.
  2  bad command line (argparse).
  3  an unexpected exception (a bug): traceback on stderr, no diagnostic. The driver reports F134.
  4  no space left on a device (ENOSPC/EDQUOT) while writing: the driver reports U011.

Fault injection (test-only): NCC_FAULT_INJECT="TOOL:KIND[,TOOL:KIND]" makes the named tool
misbehave as it starts, for real: abort (SIGABRT), segv (a real null-pointer read), kill (SIGKILL
to itself), oom (allocates memory until something kills it), hang (sleeps forever), exit (exit 3),
raise (exit 3 with a traceback), slow (sleeps 3 s, then works normally: time for a test to change
something mid-compile). "TOOL:KIND@TEXT" misbehaves only when TEXT occurs in the tool's command
line (one model of a farm); "@pass=NAME" and "@op=PATTERN" move the fault to the start of a named
pass, in modules that hold an opcode pattern, and the kinds max_to_add / drop_wait make that pass
miscompile instead (ncc.tools.common.faults says how).
"""

from __future__ import annotations

import argparse
import errno
import gc
import os
import sys
import traceback
from collections.abc import Callable

from ncc.schemas import diagnostic_pb2
from ncc.tools.common.errors import CompileError
from ncc.tools.common.faults import FAULT_ENV, inject_fault  # noqa: F401  (FAULT_ENV: re-exported)
from ncc.tools.common.lifetime import die_with_parent_from_env
from ncc.tools.common.protoio import write_proto

EXIT_OK, EXIT_COMPILE_ERROR, EXIT_USAGE, EXIT_INTERNAL, EXIT_NO_SPACE = 0, 1, 2, 3, 4

# The cyclic garbage collector's thresholds for a stage tool. A tool builds millions of long-lived
# objects (protobuf wrappers, tuples, dict entries) and frees few cycles, so Python's default
# (700, 10, 10) collects the young generation after every 700 allocations and rescans the whole
# heap ever more often. Measured on the 100k-instruction chain's walrus job: 3.8 s of ~32 s in
# 5,912 collections (22 full); with these, 0.8 s in 77 (none full), peak RSS +3 % (mypy raises
# its thresholds for the same reason).
GC_THRESHOLDS = (50_000, 20, 100)


def exit_now(code: int) -> None:
    """End a stage tool with `code` without tearing its heap down: its outputs are written and
    closed by then, and freeing millions of objects one by one at exit took 0.17 s of the
    100k-instruction walrus job (more in the frontend's). Only the standard streams need a flush."""
    for stream in (sys.stdout, sys.stderr):
        try:
            stream.flush()
        except (OSError, ValueError):  # a closed or broken stream: nothing more can be said on it
            pass
    os._exit(code)


def run_tool(tool: str, parser: argparse.ArgumentParser, body: Callable[[argparse.Namespace], None]) -> int:
    """Parse arguments, run `body`, and turn its CompileError into a diagnostic file and exit 1."""
    die_with_parent_from_env()
    gc.set_threshold(*GC_THRESHOLDS)
    parser.add_argument("--diagnostics", help="where to write a Diagnostic proto on a compile error")
    args = parser.parse_args()
    try:
        inject_fault(tool)
        body(args)
    except CompileError as err:
        diagnostic = diagnostic_pb2.Diagnostic(
            code=err.code,
            severity=diagnostic_pb2.ERROR,
            message=err.message,
            location=err.location,
            tool=tool,
        )
        if args.diagnostics:
            write_proto(args.diagnostics, diagnostic)
        print(f"{tool}: error: {err.one_line()}", file=sys.stderr)
        return EXIT_COMPILE_ERROR
    except OSError as err:
        if err.errno in (errno.ENOSPC, errno.EDQUOT):
            where = err.filename or "an output"
            print(f"{tool}: error: no space left on device writing {where}", file=sys.stderr)
            return EXIT_NO_SPACE
        traceback.print_exc()
        return EXIT_INTERNAL
    except Exception:
        traceback.print_exc()
        return EXIT_INTERNAL
    return EXIT_OK
