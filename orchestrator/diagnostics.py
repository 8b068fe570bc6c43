"""Every driver diagnostic code and every exit code of `ncc`, in one table.

Why one module: a user (or a compile farm bucketing thousands of failures) must be able to rely
on a code meaning one thing and on the exit status following from the code alone. Tools report
their own E-codes (a compile error in the user's input, exit 1 of ncc); the driver adds:

* U-codes — a problem with the command line or the environment (exit 2 or 3),
* R-codes — `ncc run` found the executed NEFF misbehaving (exit 5),
* F-codes — an internal failure, named after the exit status of a shell reporting the death
  (F137 SIGKILL, F139 SIGSEGV, F134 SIGABRT and every other abnormal end; exit 4).

Every message is one line: `ncc: error: [CODE] <what happened>; work dir <dir>; see <log>`.
docs/diagnostics.md is the user-facing copy of this table.
"""

from __future__ import annotations

import enum
import os
from dataclasses import dataclass
from pathlib import Path


class ExitCode(enum.IntEnum):
    """The exit statuses of `ncc`; each diagnostic code maps to exactly one."""

    OK = 0
    COMPILE_ERROR = 1  # the user's input is wrong: a tool's E-code diagnostic
    USAGE = 2  # bad command line or missing input file (U-codes)
    ENVIRONMENT = 3  # the machine is in the way: unwritable work dir, lock held (U-codes)
    INTERNAL = 4  # a tool or the driver crashed, was killed or misbehaved (F-codes)
    CHECK_FAILED = 5  # a correctness check found the compiled program wrong: a compiler bug (R-, E41x, E61x)
    INTERRUPTED = 130  # Ctrl-C (128 + SIGINT, as a shell would report it)


@dataclass(frozen=True)
class Code:
    """One row of the table: the code, its exit status and a short title for docs and logs."""

    code: str
    exit_code: ExitCode
    title: str


_TABLE: tuple[Code, ...] = (
    Code("U001", ExitCode.USAGE, "an input file (model, NEFF, inputs) does not exist or is not readable"),
    Code("U002", ExitCode.USAGE, "invalid command line (unknown command, bad option or value)"),
    Code("U003", ExitCode.ENVIRONMENT, "the work directory cannot be created or written"),
    Code("U004", ExitCode.USAGE, "the directory of the output file does not exist"),
    Code("U005", ExitCode.ENVIRONMENT, "the output file cannot be written"),
    Code("U006", ExitCode.ENVIRONMENT, "the work directory is in use by another ncc process"),
    Code("U007", ExitCode.INTERRUPTED, "interrupted by the user (SIGINT)"),
    Code("U008", ExitCode.USAGE, "inputs for `ncc run` or --verify-inputs are not a readable .npz"),
    Code("U009", ExitCode.ENVIRONMENT, "the stage cache directory cannot be created or written"),
    Code("U010", ExitCode.ENVIRONMENT, "the model file changed or disappeared while it was being compiled"),
    Code("U011", ExitCode.ENVIRONMENT, "no space left on the file system of the work directory or an output"),
    Code("U012", ExitCode.ENVIRONMENT, "too few open files allowed (ulimit -n) for ncc to work"),
    Code("U013", ExitCode.ENVIRONMENT, "POSIX shared memory (/dev/shm) is unusable: Luigi's worker needs it"),
    Code("U014", ExitCode.USAGE, "`ncc triage`: the folder is neither an ncc work directory nor a farm"),
    Code("U015", ExitCode.USAGE, "`ncc triage --bundle`: the work directory has no failed job to bundle"),
    Code("U016", ExitCode.USAGE, "`ncc reduce --workdir`: no failed job there (or not the --job named)"),
    Code("U017", ExitCode.USAGE, "`ncc reduce`: the module is not interesting to begin with"),
    Code("U018", ExitCode.USAGE, "`ncc reduce`: the module cannot be read or does not pass ncc's verifier"),
    Code(
        "U019",
        ExitCode.USAGE,
        "`ncc bisect`: not a work directory, or one whose compile did not get as far as the backend",
    ),
    Code("R001", ExitCode.CHECK_FAILED, "the simulator found a data race in the NEFF"),
    Code("R002", ExitCode.CHECK_FAILED, "the simulator found a deadlock in the NEFF"),
    Code("R003", ExitCode.CHECK_FAILED, "the NEFF ends an inference with semaphores not reset"),
    # Tool codes that report the compiler's own output as wrong, not the user's input:
    Code("E410", ExitCode.CHECK_FAILED, "birverifier: the backend broke a rule of the machine"),
    Code("E411", ExitCode.CHECK_FAILED, "bir_sim: the compiled program races or deadlocks"),
    Code("E412", ExitCode.CHECK_FAILED, "bir_sim: the compiled program computes something else"),
    Code("E610", ExitCode.CHECK_FAILED, "--verify: the NEFF's outputs differ from the golden evaluator's"),
    Code("E611", ExitCode.CHECK_FAILED, "--verify: the NEFF has a data race"),
    Code("E612", ExitCode.CHECK_FAILED, "--verify: the NEFF deadlocks"),
    Code("E613", ExitCode.CHECK_FAILED, "--verify: the NEFF ends an inference with semaphores not reset"),
    Code(
        "F134",
        ExitCode.INTERNAL,
        "a job or the driver terminated abnormally (SIGABRT, exit without diagnostic, ...)",
    ),
    Code(
        "F137",
        ExitCode.INTERNAL,
        "a job or the driver was forcibly killed (SIGKILL), most often out of memory",
    ),
    Code("F139", ExitCode.INTERNAL, "a job or the driver crashed with a segmentation fault (SIGSEGV)"),
)

CODES: dict[str, Code] = {row.code: row for row in _TABLE}

# Other codes a tool reports itself (E101, E201, ...) are compile errors in the user's input.
TOOL_CODE_EXIT = ExitCode.COMPILE_ERROR


def exit_code_for(code: str) -> ExitCode:
    """The exit status `ncc` ends with for a diagnostic code (tool E-codes → 1)."""
    row = CODES.get(code)
    if row is not None:
        return row.exit_code
    if code.startswith("E"):
        return TOOL_CODE_EXIT
    return ExitCode.INTERNAL


def _is_control(char: str) -> bool:
    code = ord(char)
    return (code < 0x20 and char not in "\t\n") or 0x7F <= code <= 0x9F


def printable(text: str) -> str:
    """`text` with control characters (C0, DEL, C1: terminal escapes, title codes) as \\xNN, so
    a hostile name in a NEFF or a model cannot drive the user's terminal."""
    return "".join(f"\\x{ord(char):02x}" if _is_control(char) else char for char in text)


def one_line(text: str) -> str:
    """Collapse whitespace and escape control characters: a message never spills over lines
    and never carries a terminal escape."""
    return printable(" ".join(text.split()))


@dataclass(frozen=True)
class NccDiagnostic:
    """A diagnostic as the user sees it: code, message and where to look next."""

    code: str
    message: str
    job: str = ""
    workdir: Path | None = None
    log: Path | None = None
    location: str = ""

    @property
    def exit_code(self) -> ExitCode:
        return exit_code_for(self.code)

    def line(self) -> str:
        """The one-line form: `ncc: error: [CODE] job X: message (at loc); work dir D; see LOG`."""
        text = self.message
        if self.job and not text.startswith("job "):
            text = f"job {self.job}: {text}"
        if self.location:
            text += f" (at {self.location})"
        if self.workdir is not None:
            text += f"; work dir {self.workdir}"
        if self.log is not None:
            text += f"; see {self.log}"
        return one_line(f"ncc: error: [{self.code}] {text}")

    def to_json(self) -> dict[str, str]:
        return {
            "code": self.code,
            "message": self.message,
            "job": self.job,
            "workdir": str(self.workdir) if self.workdir is not None else "",
            "log": str(self.log) if self.log is not None else "",
            "location": self.location,
        }

    @classmethod
    def from_json(cls, data: dict[str, str]) -> NccDiagnostic:
        return cls(
            code=data["code"],
            message=data["message"],
            job=data.get("job", ""),
            workdir=Path(data["workdir"]) if data.get("workdir") else None,
            log=Path(data["log"]) if data.get("log") else None,
            location=data.get("location", ""),
        )


class NccError(Exception):
    """Raised anywhere in the driver to stop with a diagnostic; the CLI prints it and exits."""

    def __init__(self, diagnostic: NccDiagnostic) -> None:
        super().__init__(diagnostic.line())
        self.diagnostic = diagnostic

    @classmethod
    def of(cls, code: str, message: str, **where: object) -> NccError:
        """Shorthand: `NccError.of("U001", "model not found: x")`."""
        return cls(NccDiagnostic(code, message, **where))  # type: ignore[arg-type]


def require_file(path: Path, what: str) -> None:
    """[U001] unless `path` is a file this process can read, saying which it is not (`what`: the
    model, NEFF, inputs...)."""
    if not path.exists():
        raise NccError.of("U001", f"{what} file not found: {path}")
    if not path.is_file():
        raise NccError.of("U001", f"{what} is not a file: {path}")
    if not os.access(path, os.R_OK):
        raise NccError.of("U001", f"{what} file is not readable: {path}")
