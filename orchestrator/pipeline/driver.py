"""CommandDriver: checks a compile request, runs it in a child process, and names how it ended.

`run()` does in the user's process only what must not fail obscurely later: the model is
readable ([U001]), the output's directory exists and is writable ([U004]/[U005]), the work
directory can be created and written ([U003]) and nobody else is using it ([U006]). Then it
starts the compile child (ncc.orchestrator.pipeline.compile_child), relays its progress lines, and
`handleError()` maps the child's end exactly as a job's end is mapped: the child's own result
if it wrote one, else [F137]/[F139]/[F134] naming the driver, the work dir and driver.stderr.log.

The parent is a child subreaper while the compile runs, so a tool orphaned by a dying compile
child is adopted by it and killed, never left running.
"""

from __future__ import annotations

import ctypes
import json
import os
import signal
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path

from ncc.orchestrator import Stopped, stop_like_ctrl_c
from ncc.orchestrator.config import settings
from ncc.orchestrator.diagnostics import ExitCode, NccDiagnostic, NccError, require_file
from ncc.orchestrator.options import CompileOptions
from ncc.orchestrator.outputs import OutputError, check_writable
from ncc.orchestrator.pipeline import luigi_setup
from ncc.orchestrator.pipeline.diskspace import looks_full, no_space_message
from ncc.orchestrator.pipeline.process_end import ProcessEnd, classify_abnormal_end
from ncc.orchestrator.pipeline.workdir import WorkDir
from ncc.tools.common.faults import FAULT_ENV, spec_problems
from ncc.tools.common.lifetime import PARENT_ENV

DRIVER_JOB = "driver (the ncc compile child process)"
_PR_SET_CHILD_SUBREAPER = 36
_INTERRUPT_GRACE_S = 10.0


@dataclass(frozen=True)
class DriverOutcome:
    exit_code: int
    diagnostic: NccDiagnostic | None = None
    summary: dict[str, object] | None = None


def _set_subreaper(enabled: bool) -> None:
    """Adopt orphaned descendants (Linux); elsewhere a no-op."""
    if not sys.platform.startswith("linux"):
        return
    try:
        ctypes.CDLL(None, use_errno=True).prctl(_PR_SET_CHILD_SUBREAPER, int(enabled), 0, 0, 0)
    except (OSError, AttributeError):
        pass


def _kill_adopted(before: set[int]) -> None:
    """SIGKILL descendants that were not ours before the compile (tools orphaned by the child)."""
    import psutil

    try:
        children = psutil.Process().children(recursive=True)
    except psutil.Error:
        return
    for proc in children:
        if proc.pid in before:
            continue
        try:
            proc.kill()
            proc.wait(timeout=5)
        except psutil.Error:
            continue
        except psutil.TimeoutExpired:
            continue


def _warn_of_faults_that_never_fire() -> None:
    """NCC_FAULT_INJECT is for tests: an item mistyped would let a fault test pass for nothing."""
    spec = os.environ.get(FAULT_ENV, "")
    for problem in spec_problems(spec) if spec else ():
        print(f"ncc: warning: {FAULT_ENV} item {problem}: it never fires as meant", file=sys.stderr)


class CommandDriver:
    def __init__(self, options: CompileOptions) -> None:
        self.options = options
        self.workdir = WorkDir(options.workdir)
        # One id for this `ncc compile`, shared by the restore attempt and the child: jobs the
        # restore took from the stage cache before a miss count as restored in the summary.
        self.run_id = os.urandom(6).hex()

    # -- checks in the user's process ---------------------------------------------------------

    def validate(self) -> None:
        """Raise NccError for a request that cannot be compiled; create nothing on failure."""
        _warn_of_faults_that_never_fire()
        model, output = self.options.model, self.options.output
        require_file(model, "model")
        inputs = self.options.verify_inputs
        if inputs is not None:
            require_file(inputs, "--verify-inputs")
            self._check_verify_inputs(inputs)
        if not output.parent.is_dir():
            raise NccError.of("U004", f"the directory of the output does not exist: {output.parent}")
        if output.is_dir():
            raise NccError.of("U002", f"--output names a directory, not a file: {output}")
        if output.exists() and os.path.samefile(output, model):
            raise NccError.of("U002", f"--output {output} is the model itself: the NEFF would overwrite it")
        if output.exists() and inputs is not None and os.path.samefile(output, inputs):
            raise NccError.of(
                "U002", f"--output {output} is the --verify-inputs file: the NEFF would overwrite it"
            )
        try:
            check_writable(output)
        except OutputError as err:
            raise NccError.of("U005", f"cannot write output {output}: {err}") from None
        made_workdir = not self.workdir.root.exists()
        self.workdir.ensure_usable()
        if self.options.cache_dir is not None:
            from ncc.orchestrator.pipeline.stage_cache import CacheError, StageCache

            try:
                StageCache(self.options.cache_dir).ensure_usable()
            except CacheError as err:
                if made_workdir:  # nothing left behind by a refused compile
                    self.workdir.root.rmdir()
                raise NccError.of("U009", str(err)) from None

    @staticmethod
    def _check_verify_inputs(inputs: Path) -> None:
        """What `ncc run --inputs` refuses is refused here too (U008: not an .npz, pickled objects,
        complex or string arrays), and names nothing takes are said to be ignored, as there."""
        from ncc.orchestrator.inputs import load_inputs

        _, _, others = load_inputs(inputs)
        if others:
            names = ", ".join(others)
            print(
                f"ncc: warning: {inputs} holds arrays that are not argN or outN, ignored: {names}",
                file=sys.stderr,
            )

    # -- the child ----------------------------------------------------------------------------

    def run(self) -> DriverOutcome:
        """Compile in a child process; the outcome to print and exit with."""
        self.validate()
        with self.workdir.locked() as lock_fd:
            self._repair_bookkeeping()
            summary = self._restore_without_tools()
            if summary is not None:
                return DriverOutcome(int(ExitCode.OK), summary=summary)
            self.workdir.driver_result.unlink(missing_ok=True)
            argv = [
                settings().python,
                "-m",
                "ncc.orchestrator.pipeline.compile_child",
                "--options",
                self.options.to_json(),
                "--result",
                str(self.workdir.driver_result),
                "--run-id",
                self.run_id,
            ]
            import psutil  # here, not at the top: a compile finished without tools never needs it

            before = {proc.pid for proc in psutil.Process().children(recursive=True)}
            _set_subreaper(True)
            try:
                end = self._run_child(argv, lock_fd)
            finally:
                _kill_adopted(before)
                _set_subreaper(False)
            return self.handleError(end)

    def _repair_bookkeeping(self) -> None:
        """Damaged bookkeeping is reported and reset, never a crash: history.jsonl keeps its
        readable lines (records, pipeline.json and the lock are checked where they are read)."""
        try:
            lost = self.workdir.repair_history()
        except OSError as err:
            raise NccError.of(
                "U003", f"cannot repair {self.workdir.history_path}: {err.strerror or err}"
            ) from None
        if lost:
            print(
                f"ncc: warning: {self.workdir.history_path} had {lost} unreadable line(s); the damaged "
                "file is kept as history.jsonl.damaged and the readable lines were kept",
                file=sys.stderr,
            )

    def _restore_without_tools(self) -> dict[str, object] | None:
        """The summary of a compile finished here, from the work dir and the stage cache alone
        (CompileCommand.restoreWithoutTools), or None when a tool must run: then the child does."""
        from ncc.orchestrator.pipeline.compile_command import CompileCommand

        command = CompileCommand(self.options)
        command.run_id = self.run_id
        try:
            summary = command.restoreWithoutTools()
        except OSError:
            return None
        return summary.to_json() if summary is not None else None

    def _run_child(self, argv: list[str], lock_fd: int) -> ProcessEnd:
        """Run the compile child to its end. It inherits the work dir's lock (so the lock outlives
        it) and dies with this process (PR_SET_PDEATHSIG via NCC_PARENT_PID); SIGTERM and SIGHUP
        stop it as Ctrl-C does."""
        env = {
            **luigi_setup.clean_environment(dict(os.environ)),
            "PYTHONFAULTHANDLER": "1",
            PARENT_ENV: str(os.getpid()),
        }
        with open(self.workdir.driver_stderr, "wb") as stderr:
            proc = subprocess.Popen(
                argv,
                cwd=self.workdir.root,  # never the user's directory: no stray luigi.cfg there
                env=env,
                stdin=subprocess.DEVNULL,
                stdout=subprocess.PIPE,
                stderr=stderr,
                pass_fds=(lock_fd,),
            )
        previous = stop_like_ctrl_c()
        try:
            assert proc.stdout is not None
            with proc.stdout:
                for line in proc.stdout:  # progress lines (--verbose >= 2)
                    sys.stderr.write(line.decode(errors="replace"))
                    sys.stderr.flush()
            _, status, usage = os.wait4(proc.pid, 0)
            proc.returncode = os.waitstatus_to_exitcode(status)
            return ProcessEnd(returncode=proc.returncode, peak_rss_bytes=usage.ru_maxrss * 1024)
        except KeyboardInterrupt as stop:  # Ctrl-C, or SIGTERM/SIGHUP as Stopped
            self._stop(proc)
            how = f"stopped by {stop.signame}" if isinstance(stop, Stopped) else "interrupted"
            raise NccError.of(
                "U007", f"compile {how}", workdir=self.workdir.root, log=self.workdir.driver_log
            ) from None
        finally:
            for sig, handler in previous.items():
                signal.signal(sig, handler)

    @staticmethod
    def _stop(proc: subprocess.Popen[bytes]) -> None:
        """On Ctrl-C, SIGTERM or SIGHUP: let the child stop its job cleanly, then make sure it is gone."""
        try:
            proc.send_signal(signal.SIGINT)
            proc.wait(timeout=_INTERRUPT_GRACE_S)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()
        except (ProcessLookupError, KeyboardInterrupt):  # a second signal: no more grace
            proc.kill()
            proc.wait()

    def handleError(self, end: ProcessEnd) -> DriverOutcome:  # noqa: N802 (the production driver's name)
        """Map the child's end to an outcome: its own result file, or an F-code for its death."""
        result = self._read_result()
        if result is not None and end.returncode == result["exit_code"]:
            if "diagnostic" in result:
                diagnostic = NccDiagnostic.from_json(result["diagnostic"])
                return DriverOutcome(int(diagnostic.exit_code), diagnostic=diagnostic)
            if end.ok:
                return DriverOutcome(int(ExitCode.OK), summary=result.get("summary"))
        if looks_full(self.workdir.root):  # the child could not even write its result
            diagnostic = NccDiagnostic("U011", no_space_message(self.workdir.root), workdir=self.workdir.root)
            return DriverOutcome(int(diagnostic.exit_code), diagnostic=diagnostic)
        code, message = classify_abnormal_end(f"job {DRIVER_JOB}", end, mem_limit_hint=False)
        diagnostic = NccDiagnostic(
            code, message, job=DRIVER_JOB, workdir=self.workdir.root, log=self.workdir.driver_stderr
        )
        return DriverOutcome(int(diagnostic.exit_code), diagnostic=diagnostic)

    def _read_result(self) -> dict | None:
        try:
            data = json.loads(self.workdir.driver_result.read_text(encoding="utf-8"))
        except (OSError, ValueError):
            return None
        return data if isinstance(data, dict) and isinstance(data.get("exit_code"), int) else None


def compile_model(options: CompileOptions) -> DriverOutcome:
    """Library entry point: the whole `ncc compile`, with usage errors as outcomes too."""
    try:
        return CommandDriver(options).run()
    except NccError as err:
        return DriverOutcome(int(err.diagnostic.exit_code), diagnostic=err.diagnostic)
