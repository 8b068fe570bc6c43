"""Versions of ncc and of each stage tool, for job cache keys and the pipeline record.

A tool's version is the ncc release plus a digest of the source it runs: its own package and
every `ncc.tools.*` / `ncc.schemas` package it imports, found by reading the sources (importlib's
find_spec locates them, importing only their parent packages). So a job's cache key changes when
the code that would compute it changes — on a developer's editable install as much as between
releases — and only the affected jobs rerun.

Reading and hashing the sources costs 35–45 ms per process, a tenth of a fully cached farm. So the
result is memoized per user (`$XDG_CACHE_HOME/ncc/tool-versions.json`), keyed by the path, size,
inode, mtime and ctime (in ns) of every file of the tool's packages: the test Python itself uses
to decide whether a `.pyc` still matches its source (mtime and size), made stricter. As git does
for its index, a memo is only written when every source last changed at least MEMO_SETTLED_S
ago, so a file edited within the clock's granularity of the memo cannot keep its old digest. A
missing, unreadable or unwritable memo only costs the hashing.
"""

from __future__ import annotations

import hashlib
import importlib.util
import json
import os
import re
import time
from functools import cache
from pathlib import Path

from ncc.tools.common.protoio import write_bytes_atomic

_SOURCE_SUFFIXES = (".py", ".json", ".proto")
# No leading \b: it would defeat the regex engine's literal-prefix scan (10x slower).
_ABSOLUTE_IMPORT = re.compile(r"ncc\.(tools\.\w+|schemas)\b")
_RELATIVE_IMPORT = re.compile(r"^[ \t]*from[ \t]+\.\.(\w+)", re.MULTILINE)
MEMO_SETTLED_S = 2.0


def ncc_version() -> str:
    from ncc.orchestrator import __version__

    return __version__


@cache
def _package_dir(dotted: str) -> Path | None:
    """Where a package's sources are, without executing the package itself."""
    try:
        spec = importlib.util.find_spec(dotted)
    except (ImportError, ValueError):
        return None
    if spec is None or not spec.submodule_search_locations:
        return None
    return Path(next(iter(spec.submodule_search_locations)))


@cache
def _scan(directory: Path) -> tuple[tuple[str, int, int, int, int], ...]:
    """Every source file under `directory` (not in __pycache__), sorted: (relative path, size,
    inode, mtime and ctime in ns), stat'ed once per process and before any of them is read. The
    ctime changes on every write, even one that sets the mtime back."""
    found: list[tuple[str, int, int, int, int]] = []
    pending = [""]
    while pending:
        folder = pending.pop()
        with os.scandir(directory / folder) as entries:
            for entry in entries:
                relative = f"{folder}/{entry.name}" if folder else entry.name
                if entry.is_dir():
                    if entry.name != "__pycache__":
                        pending.append(relative)
                elif entry.name.endswith(_SOURCE_SUFFIXES) and entry.is_file():
                    info = entry.stat()
                    found.append((relative, info.st_size, info.st_ino, info.st_mtime_ns, info.st_ctime_ns))
    return tuple(sorted(found))


def _imported_packages(dotted: str, text: str) -> set[str]:
    """The ncc.tools.* / ncc.schemas packages a source file imports."""
    found: set[str] = set()
    if "ncc." in text:
        found.update(f"ncc.{name}" for name in _ABSOLUTE_IMPORT.findall(text))
    if dotted.startswith("ncc.tools.") and "from .." in text:
        found.update(f"ncc.tools.{name}" for name in _RELATIVE_IMPORT.findall(text))
    return found


def memo_path() -> Path:
    home = os.environ.get("XDG_CACHE_HOME") or os.path.join(os.path.expanduser("~"), ".cache")
    return Path(home) / "ncc" / "tool-versions.json"


def _stat_signature(packages: list[tuple[str, str]]) -> tuple[str, int]:
    """A digest of where each package resolves and of every source file's stat; and the newest
    change among them (ns)."""
    digest = hashlib.sha256()
    newest = 0
    for dotted, recorded in packages:
        directory = _package_dir(dotted)
        digest.update(f"{dotted}={directory}\n".encode())
        if directory is None or str(directory) != recorded:
            continue
        for relative, size, inode, mtime_ns, ctime_ns in _scan(directory):
            digest.update(f"{relative}:{size}:{inode}:{mtime_ns}:{ctime_ns}\n".encode())
            newest = max(newest, mtime_ns, ctime_ns)
    return digest.hexdigest(), newest


def _read_memo(path: Path) -> dict[str, dict]:
    """tool -> its memo entry, from a memo of this ncc release; {} if there is none usable."""
    try:
        memo = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return {}
    tools = memo.get("tools") if isinstance(memo, dict) and memo.get("ncc") == ncc_version() else None
    if not isinstance(tools, dict):
        return {}
    return {tool: entry for tool, entry in tools.items() if isinstance(entry, dict)}


def _hash_sources(tool: str) -> tuple[str, list[tuple[str, str]]]:
    """The digest of the tool's source closure, and the (package, directory) pairs it covers."""
    digest = hashlib.sha256()
    pending = [f"ncc.tools.{tool}"]
    done: set[str] = set()
    packages: list[tuple[str, str]] = []
    while pending:
        dotted = pending.pop()
        if dotted in done:
            continue
        done.add(dotted)
        directory = _package_dir(dotted)
        packages.append((dotted, str(directory)))
        if directory is None:
            digest.update(f"{dotted}:missing\n".encode())
            continue
        imported: set[str] = set()
        for relative, *_ in _scan(directory):
            data = (directory / relative).read_bytes()
            digest.update(f"{dotted}/{relative}\n".encode())
            digest.update(data)
            if relative.endswith(".py"):
                imported |= _imported_packages(dotted, data.decode("utf-8", errors="replace"))
        pending.extend(sorted(imported - done))
    return digest.hexdigest()[:12], packages


@cache
def tool_version(tool: str) -> str:
    """`<ncc version>+<12 hex digits of the tool's source closure>` for tool package `tool`."""
    path = memo_path()
    memo = _read_memo(path)
    entry = memo.get(tool)
    if entry is not None:
        try:
            packages = [(str(dotted), str(directory)) for dotted, directory in entry["packages"]]
            digest = str(entry["digest"])
            if re.fullmatch(r"[0-9a-f]{12}", digest) and _stat_signature(packages)[0] == entry["stat"]:
                return f"{ncc_version()}+{digest}"
        except (KeyError, TypeError, ValueError, OSError):
            pass
    source_digest, packages = _hash_sources(tool)
    signature, newest = _stat_signature(packages)
    if newest < time.time_ns() - MEMO_SETTLED_S * 1e9:
        memo[tool] = {"packages": packages, "stat": signature, "digest": source_digest}
        try:
            path.parent.mkdir(parents=True, exist_ok=True)
            data = json.dumps({"ncc": ncc_version(), "tools": memo}, indent=1, sort_keys=True)
            write_bytes_atomic(path, data.encode(), durable=False)
        except OSError:
            pass
    return f"{ncc_version()}+{source_digest}"
