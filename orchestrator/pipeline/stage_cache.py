"""The stage cache: a job's outputs stored under its cache key, shared by every work dir and farm.

A job's cache key is the digest of (tool, tool version, canonical flags, input digests), so two
jobs with one key compute the same files. Layout of a cache directory:

    entries/ab/<key>/        one entry per key (ab = the key's first two hex digits)
        entry.json           {"key", "job", "tool", "tool_version", "outputs": [{name, sha256, size}]}
        <output files>       as the job wrote them
    staging/                 entries being written, and entries being deleted
    events.log               one line per hit / miss / corrupt / store (what `ncc cache stats` counts)

Why it never lies:
* An entry appears all at once: it is written in staging/ (files, fsync, entry.json last) and
  renamed into entries/ in one step. Two writers of one key race harmlessly: the first rename
  wins, the second finds the key present and drops its copy.
* Every hit is verified: each output is copied out while its sha256 is computed, and only a copy
  whose digest and size match entry.json is renamed into the job's folder. A mismatch, a missing
  file or an unreadable entry.json makes the entry corrupt: it is removed (renamed away first, so
  no reader sees half of it), the event is counted, and the job runs as on a miss.
* Removal (corruption, `gc`) is a rename into staging/ followed by deletion, so a reader sees
  the entry whole or not at all; a reader whose files vanish mid-copy treats it as a miss.
The least recently used order for `gc` is the mtime of entry.json, touched on every hit.
"""

from __future__ import annotations

import errno
import hashlib
import json
import os
import shutil
import time
from collections import Counter
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

ENTRY = "entry.json"
EVENTS = "events.log"
_CHUNK = 1 << 20
HIT, MISS, CORRUPT = "hit", "miss", "corrupt"  # outcomes of a lookup
STORE = "store"
ABANDONED_AFTER_S = 3600.0  # a staging folder this old belongs to a writer that died


class CacheError(Exception):
    """The cache directory cannot be used (not creatable, not writable)."""


@dataclass(frozen=True)
class CachedOutput:
    name: str
    sha256: str
    size: int


@dataclass(frozen=True)
class CacheStats:
    hits: int
    misses: int
    corrupt: int
    stores: int
    entries: int
    size_bytes: int

    def to_json(self) -> dict[str, int]:
        return dict(self.__dict__)


def _copy_hashing(source: Path, target: Path, durable: bool) -> tuple[str, int]:
    """Copy `source` to `target` (created new; fsynced if `durable`); the copy's sha256 and size."""
    digest = hashlib.sha256()
    size = 0
    with open(source, "rb") as src, open(target, "xb") as dst:
        while chunk := src.read(_CHUNK):
            digest.update(chunk)
            dst.write(chunk)
            size += len(chunk)
        if durable:
            dst.flush()
            os.fsync(dst.fileno())
    return digest.hexdigest(), size


def _entry_size(directory: Path) -> int:
    total = 0
    for path in directory.iterdir():
        try:
            total += path.stat().st_size
        except OSError:
            continue
    return total


class StageCache:
    """A content-addressed store of job outputs in one directory (see the module docstring)."""

    def __init__(self, root: Path) -> None:
        self.root = root
        self.entries = root / "entries"
        self.staging = root / "staging"

    def ensure_usable(self) -> bool:
        """Create the layout and prove it is writable: True; False for a cache that exists and can
        be read but not written (a read-only mount of a shared cache: hits restore, stores fail
        and are reported); else raise CacheError."""
        try:
            self.entries.mkdir(parents=True, exist_ok=True)
            self.staging.mkdir(parents=True, exist_ok=True)
            probe = self.staging / f".probe-{os.urandom(8).hex()}"
            probe.write_bytes(b"")
            probe.unlink()
        except OSError as err:
            if err.errno in (errno.EACCES, errno.EPERM, errno.EROFS) and self._readable():
                return False
            where = f" ({err.filename})" if err.filename and Path(err.filename) != self.root else ""
            reason = f"{err.strerror or err}{where}"
            raise CacheError(f"cannot use cache directory {self.root}: {reason}") from None
        return True

    def _readable(self) -> bool:
        return self.entries.is_dir() and os.access(self.entries, os.R_OK | os.X_OK)

    def entry_dir(self, key: str) -> Path:
        return self.entries / key[:2] / key

    # -- events -------------------------------------------------------------------------------

    def _event(self, kind: str, key: str, job: str) -> None:
        """Append one line (a single O_APPEND write: concurrent writers never interleave)."""
        line = json.dumps({"event": kind, "key": key, "job": job, "time": time.time()}) + "\n"
        try:
            fd = os.open(self.root / EVENTS, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o644)
            try:
                os.write(fd, line.encode())
            finally:
                os.close(fd)
        except OSError:
            pass  # statistics are best effort; the entries are what must be right

    # -- reading ------------------------------------------------------------------------------

    def _read_entry(self, directory: Path) -> list[CachedOutput] | None:
        """The outputs entry.json lists, or None if it is missing or malformed."""
        try:
            data = json.loads((directory / ENTRY).read_text(encoding="utf-8"))
            return [CachedOutput(str(o["name"]), str(o["sha256"]), int(o["size"])) for o in data["outputs"]]
        except (OSError, ValueError, KeyError, TypeError):
            return None

    def restore(self, key: str, job: str, names: Sequence[str], destination: Path) -> str:
        """Copy the outputs `names` of entry `key` into `destination`, verified: HIT, MISS or CORRUPT.

        On success every file is in place with the digest recorded in the entry; on a miss or a
        corrupt entry nothing is left in `destination` (files are copied under temporary names
        and renamed only once all of them verified).
        """
        directory = self.entry_dir(key)
        if not directory.is_dir():
            self._event(MISS, key, job)
            return MISS
        outputs = self._read_entry(directory)
        by_name = {o.name: o for o in outputs or ()}
        if outputs is None or sorted(by_name) != sorted(names):
            return self._corrupt(key, job, directory)
        token = os.urandom(4).hex()
        copies: list[tuple[Path, Path]] = []
        try:
            for name in names:
                expected = by_name[name]
                temporary = destination / f".{name}.{token}.restore"
                copies.append((temporary, destination / name))
                # Not fsynced: a work dir's files are verified by digest whenever they are used.
                digest, size = _copy_hashing(directory / name, temporary, durable=False)
                if digest != expected.sha256 or size != expected.size:
                    self._discard(copies)
                    return self._corrupt(key, job, directory)
        except FileNotFoundError:
            self._discard(copies)
            if directory.is_dir():  # a file of a present entry is missing: the entry is damaged
                return self._corrupt(key, job, directory)
            self._event(MISS, key, job)  # removed by gc or another reader meanwhile
            return MISS
        except OSError:
            self._discard(copies)
            raise
        for temporary, final in copies:
            os.replace(temporary, final)
        try:
            os.utime(directory / ENTRY)  # most recently used, for gc
        except OSError:
            pass
        self._event(HIT, key, job)
        return HIT

    @staticmethod
    def _discard(copies: list[tuple[Path, Path]]) -> None:
        for temporary, _ in copies:
            temporary.unlink(missing_ok=True)

    def _corrupt(self, key: str, job: str, directory: Path) -> str:
        self._remove(directory)
        self._event(CORRUPT, key, job)
        return CORRUPT

    def _remove(self, directory: Path) -> None:
        """Take an entry out of entries/ in one rename, then delete it."""
        grave = self.staging / f"dead-{directory.name}-{os.urandom(4).hex()}"
        try:
            os.rename(directory, grave)
        except OSError:
            return  # already gone (another process removed it)
        shutil.rmtree(grave, ignore_errors=True)

    # -- writing ------------------------------------------------------------------------------

    def store(self, key: str, job: str, tool: str, tool_version: str, files: Sequence[Path]) -> bool:
        """Add the outputs `files` under `key`; False if the key was already present.

        Raises OSError when the cache cannot be written (the caller decides whether that matters).
        """
        final = self.entry_dir(key)
        if final.is_dir():
            return False
        stage = self.staging / f"new-{key[:16]}-{os.urandom(4).hex()}"
        try:
            stage.mkdir(parents=True)
            outputs = []
            for path in files:
                digest, size = _copy_hashing(path, stage / path.name, durable=True)
                outputs.append({"name": path.name, "sha256": digest, "size": size})
            entry = {"key": key, "job": job, "tool": tool, "tool_version": tool_version, "outputs": outputs}
            with open(stage / ENTRY, "x", encoding="utf-8") as handle:
                json.dump(entry, handle, indent=1, sort_keys=True)
                handle.flush()
                os.fsync(handle.fileno())
            final.parent.mkdir(parents=True, exist_ok=True)
            try:
                os.rename(stage, final)
            except OSError:
                if final.is_dir():  # another writer stored the same key first
                    return False
                raise
        finally:
            if stage.exists():
                shutil.rmtree(stage, ignore_errors=True)
        self._event(STORE, key, job)
        return True

    # -- maintenance --------------------------------------------------------------------------

    def _all_entries(self) -> list[tuple[float, int, Path]]:
        """(last use, bytes, folder) of every entry."""
        found = []
        if not self.entries.is_dir():
            return found
        for shard in self.entries.iterdir():
            if not shard.is_dir():
                continue
            for directory in shard.iterdir():
                try:
                    used = (directory / ENTRY).stat().st_mtime
                except OSError:
                    used = 0.0  # no entry.json: oldest, first to go
                found.append((used, _entry_size(directory), directory))
        return found

    def events_mark(self) -> int:
        """Where the event log ends now: `corrupt_keys(mark)` later reads only what came after."""
        try:
            return (self.root / EVENTS).stat().st_size
        except OSError:
            return 0

    def _events(self, offset: int = 0) -> list[dict]:
        events = []
        try:
            with open(self.root / EVENTS, "rb") as handle:
                handle.seek(offset)
                for line in handle:
                    try:
                        event = json.loads(line)
                    except ValueError:
                        continue
                    if isinstance(event, dict):
                        events.append(event)
        except OSError:
            pass
        return events

    def corrupt_keys(self, mark: int) -> set[str]:
        """Keys whose entry was found corrupt (and removed) since `events_mark()` gave `mark`
        (by any process: the log is appended to, so it reads only the events of this farm, not
        the whole history of a cache that many farms share)."""
        return {str(event.get("key")) for event in self._events(mark) if event.get("event") == CORRUPT}

    def stats(self) -> CacheStats:
        counts: Counter[str] = Counter(str(event.get("event", "")) for event in self._events())
        entries = self._all_entries()
        return CacheStats(
            hits=counts[HIT],
            misses=counts[MISS],
            corrupt=counts[CORRUPT],
            stores=counts[STORE],
            entries=len(entries),
            size_bytes=sum(size for _, size, _ in entries),
        )

    def gc(self, max_bytes: int) -> tuple[int, int]:
        """Evict least recently used entries until at most `max_bytes` remain; (entries, bytes) freed."""
        entries = sorted(self._all_entries(), key=lambda item: item[0])
        total = sum(size for _, size, _ in entries)
        removed = freed = 0
        for _, size, directory in entries:
            if total <= max_bytes:
                break
            self._remove(directory)
            total -= size
            removed += 1
            freed += size
        abandoned = time.time() - ABANDONED_AFTER_S
        for leftover in self.staging.iterdir() if self.staging.is_dir() else ():
            try:
                old = leftover.stat().st_mtime < abandoned
            except OSError:
                continue
            if leftover.name.startswith("dead-") or old:  # deleted entries; writers that died
                shutil.rmtree(leftover, ignore_errors=True)
        return removed, freed
