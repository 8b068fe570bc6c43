"""Tool versions: a digest of each tool's source closure, memoized per user by file stat.

The memo must never outlive a change to a source: an edit (even one that keeps the size), a new
file or a package that moves gives a new version, and a source newer than the settling window is
not memoized at all. A missing or unwritable memo only costs the hashing.
"""

from __future__ import annotations

import json
import os
import time
from pathlib import Path

import pytest

from ncc.orchestrator import versions

OLD = time.time() - 3600


@pytest.fixture
def fake_tool(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """`ncc.tools.fake`: a package in tmp_path that imports `ncc.tools.helper`, also in tmp_path."""
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "cache"))
    monkeypatch.setattr(versions, "MEMO_SETTLED_S", 0.0)  # the files were all just created
    packages = {"ncc.tools.fake": tmp_path / "fake", "ncc.tools.helper": tmp_path / "helper"}
    (tmp_path / "fake").mkdir()
    (tmp_path / "helper").mkdir()
    write(tmp_path / "fake" / "__init__.py", "from ncc.tools.helper import x\n")
    write(tmp_path / "helper" / "__init__.py", "x = 1\n")
    real = versions._package_dir.__wrapped__
    monkeypatch.setattr(versions, "_package_dir", lambda dotted: packages.get(dotted) or real(dotted))
    forget()
    yield tmp_path
    forget()


def write(path: Path, text: str, mtime: float = OLD) -> None:
    path.write_text(text)
    os.utime(path, (mtime, mtime))


def forget() -> None:
    """A new process: no in-memory result (the memo file stays)."""
    versions.tool_version.cache_clear()
    versions._scan.cache_clear()


def hashed(tool: str) -> str:
    """The version computed from the sources alone, bypassing the memo."""
    return f"{versions.ncc_version()}+{versions._hash_sources(tool)[0]}"


def test_a_memoized_version_is_the_hashed_one_and_is_reused(fake_tool: Path) -> None:
    first = versions.tool_version("fake")
    assert first == hashed("fake")
    memo = json.loads(versions.memo_path().read_text())
    assert memo["tools"]["fake"]["digest"] == first.split("+")[1]
    forget()
    assert versions.tool_version("fake") == first


@pytest.mark.parametrize("change", ["same_size_edit", "imported_package_edit", "new_file"])
def test_any_change_to_the_closure_gives_a_new_version(fake_tool: Path, change: str) -> None:
    before = versions.tool_version("fake")
    forget()
    if change == "same_size_edit":
        write(fake_tool / "fake" / "__init__.py", "from ncc.tools.helper import y\n", OLD + 1)
    elif change == "imported_package_edit":
        write(fake_tool / "helper" / "__init__.py", "x = 2\n", OLD)  # same size, same mtime
    else:
        write(fake_tool / "fake" / "extra.py", "pass\n")
    after = versions.tool_version("fake")
    assert after != before
    forget()
    assert after == hashed("fake")


def test_a_source_edited_just_now_is_not_memoized(fake_tool: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    versions.tool_version("fake")
    forget()
    monkeypatch.setattr(versions, "MEMO_SETTLED_S", 60.0)
    write(fake_tool / "helper" / "__init__.py", "x = 3\n", time.time())
    fresh = versions.tool_version("fake")
    assert fresh == hashed("fake")
    memo = json.loads(versions.memo_path().read_text())
    assert memo["tools"]["fake"]["digest"] != fresh.split("+")[1]  # the old entry, now unused


def test_an_unusable_memo_only_costs_the_hashing(fake_tool: Path) -> None:
    cache = fake_tool / "cache"
    cache.write_text("not a directory")
    assert versions.tool_version("fake") == hashed("fake")
    cache.unlink()
    versions.memo_path().parent.mkdir(parents=True)
    for damaged in ("{not json", json.dumps({"ncc": versions.ncc_version(), "tools": []})):
        versions.memo_path().write_text(damaged)
        forget()
        assert versions.tool_version("fake") == hashed("fake")
    memo = json.loads(versions.memo_path().read_text())
    memo["tools"]["fake"]["digest"] = "not a digest"
    versions.memo_path().write_text(json.dumps(memo))
    forget()
    assert versions.tool_version("fake") == hashed("fake")
