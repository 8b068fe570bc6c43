"""Make Luigi behave the same wherever ncc runs, and keep its chatter out of the user's way.

Luigi's configuration is a process-wide singleton filled from luigi.cfg in the current
directory, /etc/luigi and $LUIGI_CONFIG_PATH. A compile must not change behaviour because of the
directory it was started in, so the compile child empties that singleton (in place: Luigi's
logging setup holds a reference to it) and pins the few settings ncc relies on.

Logging: Luigi's loggers and ncc's go to driver.log in full (with tracebacks). The console gets
them only at --verbose ≥ 2 (Luigi's execution summary included), and never with a traceback.
"""

from __future__ import annotations

import logging
import os
import sys
import warnings
from pathlib import Path
from typing import TextIO

_LUIGI_ENV = ("LUIGI_CONFIG_PATH", "LUIGI_CONFIG_PARSER")
_LOGGERS = ("luigi", "luigi-interface", "ncc")

# Settings ncc depends on, whatever any configuration file says.
PINNED: dict[str, dict[str, str]] = {
    "core": {"no_configure_logging": "true"},  # ncc configures logging itself (below)
    "worker": {"check_unfulfilled_deps": "true"},  # a job never runs on missing inputs
}


def clean_environment(env: dict[str, str]) -> dict[str, str]:
    """The environment for the compile child: without Luigi's configuration overrides."""
    return {key: value for key, value in env.items() if key not in _LUIGI_ENV}


def isolate_config() -> None:
    """Drop every configuration file Luigi may have read and apply PINNED."""
    for key in _LUIGI_ENV:
        os.environ.pop(key, None)
    with warnings.catch_warnings():  # importing Luigi warns about its range-task autoload default
        warnings.simplefilter("ignore", DeprecationWarning)
        from luigi.configuration import LuigiConfigParser, get_config

    LuigiConfigParser._config_paths = []  # later reloads read nothing either
    config = get_config()
    for section in config.sections():
        config.remove_section(section)
    for key in list(config.defaults()):
        config.remove_option(config.default_section, key)
    for section, values in PINNED.items():
        config.add_section(section)
        for key, value in values.items():
            config.set(section, key, value)


def require_shared_memory() -> None:
    """Raise [U013] unless POSIX semaphores work: every Luigi worker makes a multiprocessing
    queue, whose lock lives in /dev/shm; without it each compile would end as an F134."""
    import multiprocessing

    from ncc.orchestrator.diagnostics import NccError

    try:
        multiprocessing.Lock()
    except OSError as err:
        raise NccError.of(
            "U013",
            f"POSIX shared memory (/dev/shm) is not usable ({err.strerror or err}); Luigi's worker needs it: "
            "mount a writable tmpfs on /dev/shm",
        ) from None


class _NoTracebackFormatter(logging.Formatter):
    """The console form of a record: its message, and of an exception only its one-line summary."""

    def format(self, record: logging.LogRecord) -> str:
        message = record.getMessage()
        error = record.exc_info[1] if record.exc_info else None
        if error is not None:
            first = str(error).splitlines()[0] if str(error) else ""
            message += f" ({type(error).__name__}: {first})"
        return f"ncc [{record.name}] {message}"


def configure_logging(verbose: int, log_file: Path, console: TextIO = sys.stdout) -> None:
    """Everything to `log_file`; to `console` at INFO for verbose 2 and DEBUG for verbose ≥ 3."""
    file_handler = logging.FileHandler(log_file, encoding="utf-8")
    file_handler.setLevel(logging.DEBUG)
    file_handler.setFormatter(logging.Formatter("%(asctime)s %(name)s %(levelname)s: %(message)s"))
    handlers: list[logging.Handler] = [file_handler]
    if verbose >= 2:
        stream = logging.StreamHandler(console)
        stream.setLevel(logging.DEBUG if verbose >= 3 else logging.INFO)
        stream.setFormatter(_NoTracebackFormatter())
        handlers.append(stream)
    for name in _LOGGERS:
        logger = logging.getLogger(name)
        logger.handlers[:] = handlers
        logger.setLevel(logging.DEBUG)
        logger.propagate = False
