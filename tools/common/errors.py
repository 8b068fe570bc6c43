"""CompileError: the one exception a tool raises for an error the user can act on.

A tool that raises it exits 1 after writing a structured Diagnostic (see toolmain). Codes are
stable and documented in docs/diagnostics.md; the first letter says who reports them:
E1xx input reading, E2xx HLO verification / unsupported constructs, E3xx lowering and
optimization, E4xx backend passes, E5xx packaging and NEFF reading, E6xx simulation.
"""

from __future__ import annotations


class CompileError(Exception):
    """An error in the user's input or request, reported as a one-line diagnostic."""

    def __init__(self, code: str, message: str, location: str = "") -> None:
        super().__init__(f"[{code}] {message}")
        self.code = code
        self.message = message
        self.location = location

    def one_line(self) -> str:
        where = f" (at {self.location})" if self.location else ""
        return f"[{self.code}] {self.message}{where}"
