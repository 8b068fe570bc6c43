"""Versions of ncc and of each stage tool, for job cache keys and the pipeline record.

A tool's version is the ncc release plus a digest of the source it runs: its own package and
every `ncc.tools.*` / `ncc.schemas` package it imports, found by reading the sources (importlib's
find_spec locates them, importing only their parent packages). So a job's cache key changes when
the code that would compute it changes — on a developer's editable install as much as between
releases — and only the affected jobs rerun.
"""

from __future__ import annotations

import hashlib
import importlib.util
import re
from functools import cache
from pathlib import Path

_SOURCE_SUFFIXES = (".py", ".json", ".proto")
# No leading \b: it would defeat the regex engine's literal-prefix scan (10x slower).
_ABSOLUTE_IMPORT = re.compile(r"ncc\.(tools\.\w+|schemas)\b")
_RELATIVE_IMPORT = re.compile(r"^[ \t]*from[ \t]+\.\.(\w+)", re.MULTILINE)


def ncc_version() -> str:
    from ncc.orchestrator import __version__

    return __version__


def _package_dir(dotted: str) -> Path | None:
    """Where a package's sources are, without executing the package itself."""
    try:
        spec = importlib.util.find_spec(dotted)
    except (ImportError, ValueError):
        return None
    if spec is None or not spec.submodule_search_locations:
        return None
    return Path(next(iter(spec.submodule_search_locations)))


def _sources(directory: Path) -> list[Path]:
    return sorted(
        path
        for path in directory.rglob("*")
        if path.suffix in _SOURCE_SUFFIXES and "__pycache__" not in path.parts and path.is_file()
    )


def _imported_packages(dotted: str, text: str) -> set[str]:
    """The ncc.tools.* / ncc.schemas packages a source file imports."""
    found: set[str] = set()
    if "ncc." in text:
        found.update(f"ncc.{name}" for name in _ABSOLUTE_IMPORT.findall(text))
    if dotted.startswith("ncc.tools.") and "from .." in text:
        found.update(f"ncc.tools.{name}" for name in _RELATIVE_IMPORT.findall(text))
    return found


@cache
def tool_version(tool: str) -> str:
    """`<ncc version>+<12 hex digits of the tool's source closure>` for tool package `tool`."""
    digest = hashlib.sha256()
    pending = [f"ncc.tools.{tool}"]
    done: set[str] = set()
    while pending:
        dotted = pending.pop()
        if dotted in done:
            continue
        done.add(dotted)
        directory = _package_dir(dotted)
        if directory is None:
            digest.update(f"{dotted}:missing\n".encode())
            continue
        imported: set[str] = set()
        for path in _sources(directory):
            data = path.read_bytes()
            digest.update(f"{dotted}/{path.relative_to(directory)}\n".encode())
            digest.update(data)
            if path.suffix == ".py":
                imported |= _imported_packages(dotted, data.decode("utf-8", errors="replace"))
        pending.extend(sorted(imported - done))
    return f"{ncc_version()}+{digest.hexdigest()[:12]}"
