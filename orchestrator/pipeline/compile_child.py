"""The compile child: the process in which CommandDriver runs one compile.

Why a separate process: whatever happens inside a compile — a bug in the driver, Luigi state,
a signal — the user's `ncc` process survives to name it ([F134]/[F137]/[F139], naming the
driver, the work directory and the log). The child reports back through a small JSON file
(driver_result.json): its exit code and either the diagnostic or the compile summary. Its stdout
carries progress lines (--verbose ≥ 2) for the parent to show; anything else it prints goes to
driver.stderr.log, so no traceback ever reaches the user's terminal.

    python -m ncc.orchestrator.pipeline.compile_child --options '<CompileOptions JSON>' --result FILE
"""

from __future__ import annotations

import argparse
import ctypes
import logging
import os
import signal
import sys
import time
from pathlib import Path

from ncc.orchestrator import restore_interrupt_handler
from ncc.orchestrator.config import settings
from ncc.orchestrator.diagnostics import ExitCode, NccDiagnostic, NccError
from ncc.orchestrator.options import CompileOptions
from ncc.orchestrator.pipeline import luigi_setup
from ncc.orchestrator.pipeline.diskspace import is_no_space, looks_full, no_space_message
from ncc.orchestrator.pipeline.run_settings import record_run_settings
from ncc.orchestrator.pipeline.workdir import WorkDir, write_json_atomic
from ncc.tools.common.lifetime import die_with_parent_from_env

log = logging.getLogger("ncc")


def inject_driver_fault(kind: str) -> None:
    """Test-only: misbehave as NCC_FAULT_INJECT="driver:KIND" asks (see ncc.orchestrator.config)."""
    if kind == "segv":
        ctypes.string_at(0)
    elif kind == "kill":
        os.kill(os.getpid(), signal.SIGKILL)
    elif kind == "abort":
        os.abort()
    elif kind == "hang":
        while True:
            time.sleep(3600)
    elif kind == "exit":
        sys.exit(int(ExitCode.INTERNAL))
    elif kind == "raise":
        raise RuntimeError("fault injected into the ncc compile driver (NCC_FAULT_INJECT=driver:raise)")


def run_compile(options: CompileOptions, run_id: str) -> tuple[int, dict[str, object]]:
    """Run one compile; the exit code and the JSON result for the parent. Never raises."""
    workdir = WorkDir(options.workdir)
    try:
        luigi_setup.configure_logging(options.verbose, workdir.driver_log)
        record_run_settings(options, run_id)  # limits and environment, for `ncc triage`
        inject_driver_fault(settings().driver_fault)
        luigi_setup.require_shared_memory()
        from ncc.orchestrator.pipeline.compile_command import CompileCommand  # imports Luigi: after isolation

        command = CompileCommand(options)
        command.run_id = run_id
        summary = command.execute()
        return int(ExitCode.OK), {"summary": summary.to_json()}
    except NccError as err:
        return int(err.diagnostic.exit_code), {"diagnostic": err.diagnostic.to_json()}
    except KeyboardInterrupt:
        diagnostic = NccDiagnostic(
            "U007", "compile interrupted", workdir=workdir.root, log=workdir.driver_log
        )
        return int(diagnostic.exit_code), {"diagnostic": diagnostic.to_json()}
    except Exception as err:
        if is_no_space(err) or looks_full(workdir.root):
            diagnostic = NccDiagnostic("U011", no_space_message(workdir.root), workdir=workdir.root)
            return int(diagnostic.exit_code), {"diagnostic": diagnostic.to_json()}
        log.exception("internal error in the ncc compile driver")
        diagnostic = NccDiagnostic(
            "F134",
            f"job driver (the ncc compile child process) failed with an internal error "
            f"({type(err).__name__}: {err})",
            job="driver",
            workdir=workdir.root,
            log=workdir.driver_log,
        )
        return int(diagnostic.exit_code), {"diagnostic": diagnostic.to_json()}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="ncc-compile-child", description=__doc__)
    parser.add_argument("--options", required=True, help="CompileOptions as JSON")
    parser.add_argument("--result", required=True, type=Path, help="where to write the result JSON")
    parser.add_argument("--run-id", default=None, help="the driver's id of this compile (default: a new one)")
    restore_interrupt_handler()
    args = parser.parse_args(argv)
    die_with_parent_from_env()  # never outlive the `ncc` that started us (it holds the lock with us)
    luigi_setup.isolate_config()
    options = CompileOptions.from_json(args.options)
    exit_code, result = run_compile(options, args.run_id or os.urandom(6).hex())
    write_json_atomic(args.result, {"exit_code": exit_code, **result})
    return exit_code


if __name__ == "__main__":
    sys.exit(main())
