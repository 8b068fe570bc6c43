"""The Penguin optimizer: the passes the Frontend runs before lowering to BIR, in order.

`fusion` joins producer/consumer nests so intermediates stay in SBUF; `cse` drops loads and
fills a nest already did; `dce` then drops the stores (and tensors) nobody reads any more. The
default list is all three, in that order, at --optlevel 1 and above; -O0 runs none. Each pass
reports what it changed, one line on stderr (the Frontend job's log).
"""

from __future__ import annotations

import sys
from collections.abc import Callable

from ncc.schemas import penguin_pb2
from ncc.tools.common.errors import CompileError
from ncc.tools.hlo_opt.cse import eliminate_common_loads
from ncc.tools.hlo_opt.dce import eliminate_dead_code
from ncc.tools.hlo_opt.fusion import fuse_nests

PASSES: dict[str, Callable[[penguin_pb2.Program], object]] = {
    "fusion": fuse_nests,
    "cse": eliminate_common_loads,
    "dce": eliminate_dead_code,
}
DEFAULT_PASSES = ("fusion", "cse", "dce")


def pass_list(text: str, optlevel: int) -> list[str]:
    """The passes to run: `text` ('a,b', or 'none') when given, else the optlevel's default."""
    if not text:
        return list(DEFAULT_PASSES) if optlevel >= 1 else []
    if text.strip() == "none":
        return []
    names = [name.strip() for name in text.split(",")]
    unknown = [name for name in names if name not in PASSES]
    if unknown:
        raise CompileError("E400", f"unknown Penguin pass '{unknown[0]}' (known: {', '.join(PASSES)})",
                           "--penguin-passes")
    return names


def optimize(program: penguin_pb2.Program, passes: list[str]) -> None:
    for name in passes:
        stats = PASSES[name](program)
        print(f"penguin-opt: {name}: {stats}", file=sys.stderr)
