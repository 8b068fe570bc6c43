"""`ncc cache stats|gc --cache-dir DIR`: look after a stage cache shared by compiles and farms.

`stats` counts hits, misses, corrupt entries found (and discarded) and stores from the cache's
event log, plus the entries and bytes it holds now. `gc --max-size SIZE` evicts the least
recently used entries until the cache holds at most SIZE (a number of bytes with an optional
K/M/G suffix). Both are safe while compiles use the cache: an entry leaves in one rename.
"""

from __future__ import annotations

import argparse
import json
import os
import re
from pathlib import Path

from ncc.orchestrator.diagnostics import NccError
from ncc.orchestrator.pipeline.stage_cache import StageCache

_SIZE = re.compile(r"^(\d+(?:\.\d+)?)\s*([KMGT]?)i?B?$", re.IGNORECASE)
_UNITS = {"": 1, "K": 1 << 10, "M": 1 << 20, "G": 1 << 30, "T": 1 << 40}


def parse_size(text: str) -> int:
    """'500M' -> 524288000; a plain number is bytes."""
    match = _SIZE.match(text.strip())
    if not match:
        raise argparse.ArgumentTypeError(f"{text!r} is not a size (e.g. 2G, 500M, 4096)")
    return int(float(match.group(1)) * _UNITS[match.group(2).upper()])


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "action", choices=("stats", "gc"), help="stats: counts and size; gc: evict LRU entries"
    )
    parser.add_argument("--cache-dir", type=Path, required=True, metavar="DIR", help="the stage cache")
    parser.add_argument("--max-size", type=parse_size, metavar="SIZE", help="gc: keep at most this much")
    parser.add_argument("--json", action="store_true", help="print the result as one JSON object")


def run(args: argparse.Namespace) -> int:
    root = Path(os.path.abspath(args.cache_dir))
    if not (root / "entries").is_dir():
        raise NccError.of("U001", f"not a stage cache (no entries/ folder): {root}")
    cache = StageCache(root)
    if args.action == "gc":
        if args.max_size is None:
            raise NccError.of("U002", "ncc cache gc: --max-size is required (see 'ncc cache --help')")
        removed, freed = cache.gc(args.max_size)
        result: dict[str, object] = {"evicted_entries": removed, "freed_bytes": freed}
    else:
        result = {}
    result.update(cache.stats().to_json())
    if args.json:
        print(json.dumps(result, sort_keys=True))
        return 0
    lookups = result["hits"] + result["misses"] + result["corrupt"]
    rate = f" ({100.0 * result['hits'] / lookups:.0f}% of lookups)" if lookups else ""
    if args.action == "gc":
        print(f"evicted {removed} entries, {freed / 1e6:.1f} MB")
    print(
        f"{root}: {result['entries']} entries, {result['size_bytes'] / 1e6:.1f} MB; "
        f"hits {result['hits']}{rate}, misses {result['misses']}, "
        f"corrupt {result['corrupt']} (discarded and recomputed), stores {result['stores']}"
    )
    return 0
