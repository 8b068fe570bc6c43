"""The line a tool with a pass manager writes to its stderr as each pass starts, and how to read it.

    walrus_driver: pass allocation (6 of 10) started

One line per pass start, flushed before the pass runs, so the last such line in a job's
stderr.log names the pass that was running when the tool crashed, hung or was killed (`ncc
triage` reads it). The tool writes it, the driver only reads files: this module is the format
both sides share.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from typing import TextIO

_LINE = re.compile(r"^(?P<tool>\w+): pass (?P<label>\S+) \((?P<index>\d+) of (?P<total>\d+)\) started$")


@dataclass(frozen=True)
class PassStart:
    tool: str
    label: str  # the pass's name, `#N` appended for its N-th run in the pipeline
    index: int  # 1-based position in the pipeline
    total: int


def pass_start_line(tool: str, label: str, index: int, total: int) -> str:
    return f"{tool}: pass {label} ({index} of {total}) started"


def log_pass_start(stream: TextIO, tool: str, label: str, index: int, total: int) -> None:
    """Write the line and flush it: a crash right after must not lose it."""
    stream.write(pass_start_line(tool, label, index, total) + "\n")
    stream.flush()


def last_pass_start(text: str) -> PassStart | None:
    """The last pass start logged in `text` (a tool's stderr), or None if it logged none."""
    found = None
    for line in text.splitlines():
        match = _LINE.match(line.rstrip())
        if match:
            found = match
    if found is None:
        return None
    return PassStart(found["tool"], found["label"], int(found["index"]), int(found["total"]))
