"""Run one half of a pass's work in a forked child, on the machine's other core.

Why: a compile farm's machine has 2 cores and a stage tool is one process. Some passes hold two
independent halves of work over the same large, read-only state: the verifier's per-instruction
rules and its abstract execution of the streams take about 4 s each at 100k instructions. A fork
shares that state copy-on-write, so the child needs no copy of the program; its answer comes back
pickled through a pipe.

The answer is the same either way, only slower: when fork is unavailable, when the work is too
small to pay for a fork, or when the child dies (a signal, an OOM kill) or sends nothing usable,
`Forked.result()` runs the function in this process instead. An exception the function raises
in the child is raised again here, so a CompileError keeps its code and message.

The child dies with its parent (tools/common/lifetime.py), leaves by os._exit (no atexit
handler, no stdio buffer of the parent flushed twice), and runs with the objects that existed at
the fork frozen out of the garbage collector: a collection would write to every tracked object's
header and copy the pages of the whole program.
"""

from __future__ import annotations

import gc
import os
import pickle
import signal
import sys
from collections.abc import Callable
from typing import Generic, TypeVar

from ncc.tools.common.lifetime import die_with_parent

T = TypeVar("T")

# Below this many instructions a pass keeps its work in one process: forking a large heap and
# sending the answer back cost more than the half of the work the child would take.
MIN_INSTRUCTIONS = 20_000

_OK, _RAISED = "ok", "raised"


class Forked(Generic[T]):
    """`fn()` started in a child now (when `parallel` and fork exist); `result()` waits for it."""

    def __init__(self, fn: Callable[[], T], parallel: bool = True) -> None:
        self._fn = fn
        self._pid = 0
        self._read_end = -1
        self.ran_in_child = False  # whether result() came from the child (for counters and tests)
        if parallel and hasattr(os, "fork"):
            self._start()

    def _start(self) -> None:
        read_end, write_end = os.pipe()
        for stream in (sys.stdout, sys.stderr):
            stream.flush()
        parent = os.getpid()
        gc.freeze()
        try:
            pid = os.fork()
        except OSError:  # no memory or no process slot for a child: the work runs here
            gc.unfreeze()
            os.close(read_end)
            os.close(write_end)
            return
        if pid == 0:  # the child: compute, send, leave
            os.close(read_end)
            status = 0
            try:
                die_with_parent(parent)
                try:
                    message = (_OK, self._fn())
                except Exception as error:  # sent to the parent, which raises it again
                    message = (_RAISED, error)
                data = pickle.dumps(message, protocol=pickle.HIGHEST_PROTOCOL)
                with os.fdopen(write_end, "wb") as pipe:
                    pipe.write(data)
            except BaseException:  # nothing usable sent: the parent runs the work itself
                status = 1
            os._exit(status)
        gc.unfreeze()
        os.close(write_end)
        self._pid, self._read_end = pid, read_end

    @property
    def started(self) -> bool:
        """A child runs `fn` (until result() or cancel())."""
        return self._pid != 0

    def result(self) -> T:
        """The function's value (or its exception), from the child if it delivered one."""
        if self._pid:
            message = self._collect()
            if message is not None:
                self.ran_in_child = True
                kind, value = message
                if kind == _RAISED:
                    raise value
                return value
        return self._fn()

    def cancel(self) -> None:
        """Stop the child, if one runs, and reap it: its answer is no longer wanted (the parent's
        own half raised), and a child blocked on a full pipe would otherwise wait forever."""
        if not self._pid:
            return
        try:
            os.kill(self._pid, signal.SIGKILL)
        except ProcessLookupError:
            pass
        os.waitpid(self._pid, 0)
        os.close(self._read_end)
        self._pid = 0

    def _collect(self) -> tuple[str, object] | None:
        """Read the child's message and reap it; None when it died or sent nothing whole."""
        chunks = []
        with os.fdopen(self._read_end, "rb") as pipe:
            while chunk := pipe.read(1 << 20):
                chunks.append(chunk)
        _, status = os.waitpid(self._pid, 0)
        self._pid = 0
        if not os.WIFEXITED(status) or os.WEXITSTATUS(status) != 0:
            return None
        try:
            message = pickle.loads(b"".join(chunks))
        except Exception:
            return None
        if not (isinstance(message, tuple) and len(message) == 2 and message[0] in (_OK, _RAISED)):
            return None
        return message

