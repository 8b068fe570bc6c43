"""tools/common/forked.py: half of a pass's work in a forked child, with the same answer as in
process when the child cannot give one (it is really killed here)."""

from __future__ import annotations

import os
import signal

import pytest

from ncc.tools.common.errors import CompileError
from ncc.tools.common.forked import Forked


def test_the_value_comes_from_a_child_process():
    parent = os.getpid()
    work = Forked(lambda: (os.getpid(), [1, 2, 3]))
    pid, value = work.result()
    assert value == [1, 2, 3] and pid != parent and work.ran_in_child


def test_a_compile_error_in_the_child_is_raised_again_with_its_code():
    def fail() -> None:
        raise CompileError("E410", "birverifier: deadlock: x: every engine is blocked", "x")

    with pytest.raises(CompileError) as err:
        Forked(fail).result()
    assert err.value.code == "E410" and err.value.location == "x"


def test_a_killed_child_leaves_the_work_to_this_process():
    parent = os.getpid()

    def work() -> int:
        if os.getpid() != parent:
            os.kill(os.getpid(), signal.SIGKILL)  # an OOM kill, as the kernel does it
        return 42

    forked = Forked(work)
    assert forked.result() == 42 and not forked.ran_in_child


def test_without_parallel_the_work_runs_here():
    parent = os.getpid()
    work = Forked(os.getpid, parallel=False)
    assert work.result() == parent and not work.ran_in_child



def test_cancel_kills_the_child_and_reaps_it():
    """The parent's own half failed: the child is stopped, not left blocked on its pipe."""
    work = Forked(lambda: os.urandom(1 << 22))  # more than a pipe holds: it would block writing
    pid = work._pid
    assert pid
    work.cancel()
    with pytest.raises(ChildProcessError):
        os.waitpid(pid, os.WNOHANG)  # already reaped
    work.cancel()  # a second cancel does nothing
