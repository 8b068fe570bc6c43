"""The stage cache: shared across work dirs, verified on every hit, safe with concurrent writers.

The unit tests drive StageCache directly; the end-to-end ones run `ncc compile --cache-dir` and
`ncc cache` for real and read what happened from the job records and the cache's statistics.
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest
from orchestrator_support import DEFAULT_JOB_DIRS, assert_one_line_error, find_model, history, job_record, ncc

from ncc.orchestrator.pipeline.stage_cache import StageCache

KEY = "ab" + "0" * 62


def _outputs(folder: Path, **files: bytes) -> list[Path]:
    folder.mkdir(parents=True, exist_ok=True)
    paths = []
    for name, data in files.items():
        (folder / name).write_bytes(data)
        paths.append(folder / name)
    return paths


def test_store_then_restore_gives_the_same_bytes(tmp_path: Path) -> None:
    cache = StageCache(tmp_path / "cache")
    cache.ensure_usable()
    files = _outputs(tmp_path / "job", a=b"alpha", b=b"beta" * 1000)
    assert cache.store(KEY, "Job", "tool", "1", files)
    assert not cache.store(KEY, "Job", "tool", "1", files)  # present: the second writer drops its copy
    out = tmp_path / "restored"
    out.mkdir()
    assert cache.restore(KEY, "Job", ["a", "b"], out) == "hit"
    assert (out / "a").read_bytes() == b"alpha" and (out / "b").read_bytes() == b"beta" * 1000
    assert sorted(p.name for p in out.iterdir()) == ["a", "b"]  # no temporary left
    stats = cache.stats()
    assert (stats.hits, stats.misses, stats.corrupt, stats.stores, stats.entries) == (1, 0, 0, 1, 1)


@pytest.mark.parametrize("damage", ["flip", "truncate", "delete", "entry_json"])
def test_a_damaged_entry_is_never_served_and_is_removed(tmp_path: Path, damage: str) -> None:
    cache = StageCache(tmp_path / "cache")
    cache.ensure_usable()
    cache.store(KEY, "Job", "tool", "1", _outputs(tmp_path / "job", a=b"alpha", b=b"beta"))
    victim = cache.entry_dir(KEY) / ("entry.json" if damage == "entry_json" else "b")
    if damage == "flip" or damage == "entry_json":
        data = bytearray(victim.read_bytes())
        data[1] ^= 0x01
        victim.write_bytes(bytes(data))
    elif damage == "truncate":
        victim.write_bytes(victim.read_bytes()[:-1])
    else:
        victim.unlink()
    out = tmp_path / "restored"
    out.mkdir()
    assert cache.restore(KEY, "Job", ["a", "b"], out) == "corrupt"
    assert list(out.iterdir()) == []  # nothing half-restored
    assert not cache.entry_dir(KEY).exists()
    assert cache.stats().corrupt == 1


def test_a_missing_key_is_a_miss(tmp_path: Path) -> None:
    cache = StageCache(tmp_path / "cache")
    cache.ensure_usable()
    assert cache.restore(KEY, "Job", ["a"], tmp_path) == "miss"
    assert cache.stats().misses == 1


_STORE_MANY = """
import sys
from pathlib import Path
from ncc.orchestrator.pipeline.stage_cache import StageCache
cache = StageCache(Path(sys.argv[1]))
files = sorted(Path(sys.argv[2]).iterdir())
for index in range(int(sys.argv[3])):
    cache.store(f"{index:02x}" + "f" * 62, "Job", "tool", "1", files)
"""


def test_concurrent_writers_of_the_same_keys_leave_whole_entries(tmp_path: Path) -> None:
    root = tmp_path / "cache"
    StageCache(root).ensure_usable()
    source = tmp_path / "job"
    _outputs(source, a=b"x" * 300_000, b=b"y" * 100)
    command = [sys.executable, "-c", _STORE_MANY, str(root), str(source), "20"]
    writers = [subprocess.Popen(command) for _ in range(4)]
    for writer in writers:
        assert writer.wait(timeout=120) == 0
    cache = StageCache(root)
    stats = cache.stats()
    assert stats.entries == 20 and stats.stores == 20  # each key stored once, by the first writer
    for index in range(20):
        out = tmp_path / f"r{index}"
        out.mkdir()
        assert cache.restore(f"{index:02x}" + "f" * 62, "Job", ["a", "b"], out) == "hit"
    assert not [p for p in (root / "staging").iterdir()]


def test_gc_evicts_least_recently_used_first(tmp_path: Path) -> None:
    import os

    cache = StageCache(tmp_path / "cache")
    cache.ensure_usable()
    keys = [f"{i:02x}" + "e" * 62 for i in range(3)]
    for age, key in enumerate(keys):
        cache.store(key, "Job", "tool", "1", _outputs(tmp_path / key, a=b"z" * 1000))
        os.utime(cache.entry_dir(key) / "entry.json", (1000 + age, 1000 + age))
    out = tmp_path / "out"
    out.mkdir()
    assert cache.restore(keys[0], "Job", ["a"], out) == "hit"  # the oldest becomes the most recent
    size = cache.stats().size_bytes
    removed, _ = cache.gc(size - 1)  # one entry must go: the least recently used is keys[1]
    assert removed == 1
    assert cache.entry_dir(keys[0]).exists() and not cache.entry_dir(keys[1]).exists()


# -- end to end ------------------------------------------------------------------------------


def _cached_jobs(workdir: Path) -> list[bool]:
    return [bool(job_record(workdir, folder).get("cached")) for folder in DEFAULT_JOB_DIRS]


def test_a_second_work_dir_restores_every_job_and_a_corrupt_entry_is_recomputed(tmp_path: Path) -> None:
    model = find_model("gelu.hlo.pb")
    cache = tmp_path / "cache"
    first = ncc("compile", model, "-o", tmp_path / "a.neff", "--cache-dir", cache)
    assert first.returncode == 0, first.stderr
    second = ncc("compile", model, "-o", tmp_path / "b.neff", "--cache-dir", cache)
    assert second.returncode == 0, second.stderr
    assert "0 of 4 jobs run, 4 restored from the cache" in second.stdout
    assert _cached_jobs(tmp_path / "b.ncc-work") == [True] * 4
    assert (tmp_path / "a.neff").read_bytes() == (tmp_path / "b.neff").read_bytes()
    # Restored without Luigi, the compile child or any tool: the child's log was never written.
    starts = [e for e in history(tmp_path / "b.ncc-work") if e["event"] == "compile_start"]
    assert [e.get("without_tools") for e in starts] == [True]
    assert not (tmp_path / "b.ncc-work" / "driver.log").exists()
    again = ncc("compile", model, "-o", tmp_path / "b.neff", "--cache-dir", cache)  # a no-op resume
    assert again.returncode == 0 and "0 of 4 jobs run" in again.stdout and "4 reused" in again.stdout

    # One flipped byte in the walrus job's cached program: that entry is discarded and recomputed;
    # the jobs before it are still restored and the job after it hits again (same bytes as before).
    key = job_record(tmp_path / "a.ncc-work", "03_WalrusDriver")["cache_key"]
    program = cache / "entries" / key[:2] / key / "program.pb"
    data = bytearray(program.read_bytes())
    data[len(data) // 2] ^= 0x10
    program.write_bytes(bytes(data))
    third = ncc("compile", model, "-o", tmp_path / "c.neff", "--cache-dir", cache)
    assert third.returncode == 0, third.stderr
    assert _cached_jobs(tmp_path / "c.ncc-work") == [True, True, False, True]
    # The summary counts the two jobs restored before the miss (by the driver, before the child
    # started) as restored, not as reused from the work dir.
    assert "1 of 4 jobs run, 3 restored from the cache, 0 reused" in third.stdout
    assert (tmp_path / "c.neff").read_bytes() == (tmp_path / "a.neff").read_bytes()

    stats = ncc("cache", "stats", "--cache-dir", cache, "--json")
    assert stats.returncode == 0, stats.stderr
    counts = json.loads(stats.stdout)
    assert counts["corrupt"] == 1 and counts["hits"] == 7 and counts["entries"] == 4
    gc = ncc("cache", "gc", "--cache-dir", cache, "--max-size", "0", "--json")
    assert json.loads(gc.stdout)["entries"] == 0


def test_an_unusable_cache_dir_is_a_one_line_error(tmp_path: Path) -> None:
    blocker = tmp_path / "file"
    blocker.write_text("not a folder")
    result = ncc(
        "compile", find_model("add_mul.hlo"), "-o", tmp_path / "x.neff", "--cache-dir", blocker / "c"
    )
    assert result.returncode == 3
    assert_one_line_error(result, "U009")
    assert not (tmp_path / "x.neff").exists() and not (tmp_path / "x.ncc-work").exists()
    (tmp_path / "c").mkdir()
    (tmp_path / "c" / "staging").write_text("a file where the cache keeps its folder")
    cache = tmp_path / "c"
    result = ncc("compile", find_model("add_mul.hlo"), "-o", tmp_path / "x.neff", "--cache-dir", cache)
    assert_one_line_error(result, "U009")
    assert f"File exists ({tmp_path / 'c' / 'staging'})" in result.stderr


@pytest.fixture
def read_only_view(tmp_path: Path):
    """A read-only bind mount of tmp_path/cache (a shared cache mounted read-only on a worker):
    needs mount privileges, as the root of a CI container has; skipped without them."""
    source, view = tmp_path / "cache", tmp_path / "cache-ro"
    source.mkdir()
    view.mkdir()
    if subprocess.run(["mount", "--bind", source, view], capture_output=True).returncode != 0:
        pytest.skip("cannot bind-mount here (needs mount privileges)")
    try:
        if subprocess.run(["mount", "-o", "remount,bind,ro", view], capture_output=True).returncode != 0:
            pytest.skip("cannot remount read-only here")
        yield source, view
    finally:
        subprocess.run(["umount", view], capture_output=True)


def test_a_read_only_cache_serves_hits_and_warns_of_what_it_could_not_store(
    tmp_path: Path, read_only_view: tuple[Path, Path]
) -> None:
    source, view = read_only_view
    first = ncc("compile", find_model("gelu.hlo.pb"), "-o", tmp_path / "a.neff", "--cache-dir", source)
    assert first.returncode == 0 and "warning" not in first.stderr, first.stderr
    hit = ncc("compile", find_model("gelu.hlo.pb"), "-o", tmp_path / "b.neff", "--cache-dir", view)
    assert hit.returncode == 0, hit.stderr
    assert "0 of 4 jobs run, 4 restored from the cache" in hit.stdout and "warning" not in hit.stderr
    miss = ncc("compile", find_model("add_mul.hlo"), "-o", tmp_path / "c.neff", "--cache-dir", view)
    assert miss.returncode == 0 and (tmp_path / "c.neff").is_file(), miss.stderr
    warning = f"ncc: warning: the stage cache {view} did not store 4 job outputs (HLOToTensorizer, Frontend"
    assert warning in miss.stderr and "Read-only file system" in miss.stderr
    assert len(miss.stderr.strip().splitlines()) == 1


def test_a_farm_over_a_read_only_cache_warns_once_of_what_it_could_not_store(
    tmp_path: Path, read_only_view: tuple[Path, Path]
) -> None:
    source, view = read_only_view
    stored = ncc("compile", find_model("add_mul.hlo"), "-o", tmp_path / "a.neff", "--cache-dir", source)
    assert stored.returncode == 0, stored.stderr  # a cache that exists (an empty read-only one is U009)
    farm = ncc("farm", find_model("gelu.hlo.pb"), "--farm-dir", tmp_path / "f", "--cache-dir", view)
    assert farm.returncode == 0, farm.stderr
    warnings = [line for line in farm.stderr.splitlines() if line.startswith("ncc: warning:")]
    assert len(warnings) == 1 and "did not store 4 job outputs" in warnings[0], farm.stderr
    assert "Read-only file system" in warnings[0]
