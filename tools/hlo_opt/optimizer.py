"""The Penguin optimizer: the passes the Frontend runs before lowering to BIR, in order.

`fusion` joins producer/consumer nests so intermediates stay in SBUF; `cse` drops loads and
fills a nest already did; `act_functions` turns an elementwise chain that computes one of ACT's
built-in functions (gelu, exact or tanh) into one activation; `broadcast_operands` lets a DVE
operation read the [P, 1] tile (a row max, a norm's scale) that was spread across a row for it
alone as its per-partition scalar operand; `dce` then drops the
stores (and tensors) nobody reads any more, and the statements of such chains;
`retile` narrows the free tiles of an elementwise nest too short to overlap its engines;
`tile_order` strip-mines a dot's row loop below its contraction loop so each weight tile serves
several row tiles; `epilogues` runs the elementwise nest after a dot (a bias, a GELU) inside the
dot's nest on each product tile as it leaves PSUM;
`pipeline` software-pipelines the loops that ask for it (or, with --num-stages, every eligible
loop); `invariant_loads` runs a load that reads the same bytes at every step of a loop (a
broadcast bias or norm weight), or a tile the loop does not change (a dot's kept stationary and moving
tiles), once; `forward` makes a load of an intermediate that an earlier nest stored from an SBUF
tile read that tile (a copy, or a PE transpose); `direct_copies` makes a tile loaded from HBM only to
be stored back one HBM-to-HBM dma; `act_operands` lets an activation take the subtract of a
per-partition tile before it as its bias and the row sum of its output as its second output (a
softmax's x − max and sum of exp, off DVE); and `dce` then drops the stores nobody reads.
The default list is all of these, in that order (dce twice), at --optlevel 1 and above; -O0 runs
none.
A pass may take options in braces, `pipeline{widen=0,check_order=0}`. Each pass reports what it
changed, one line on stderr (the Frontend job's log).
"""

from __future__ import annotations

import sys
from collections.abc import Callable

from ncc.schemas import penguin_pb2
from ncc.tools.common.errors import CompileError
from ncc.tools.common.pipeline_text import split_pipeline
from ncc.tools.hlo_opt.passes.act_functions import select_act_functions
from ncc.tools.hlo_opt.passes.act_operands import fold_act_operands
from ncc.tools.hlo_opt.passes.broadcast_operands import fold_broadcast_operands
from ncc.tools.hlo_opt.passes.cse import eliminate_common_loads
from ncc.tools.hlo_opt.passes.dce import eliminate_dead_code
from ncc.tools.hlo_opt.passes.direct_copies import copy_directly
from ncc.tools.hlo_opt.passes.epilogues import fuse_epilogues
from ncc.tools.hlo_opt.passes.forwarding import forward_tiles
from ncc.tools.hlo_opt.passes.fusion import fuse_nests
from ncc.tools.hlo_opt.passes.invariant_loads import hoist_invariant_loads
from ncc.tools.hlo_opt.passes.pipelining import pipeline_loops
from ncc.tools.hlo_opt.passes.retile import retile_nests
from ncc.tools.hlo_opt.passes.tile_order import order_tiles
from ncc.tools.hlo_opt.segments import optimize_segments

PASSES: dict[str, Callable[..., object]] = {
    "fusion": fuse_nests,
    "cse": eliminate_common_loads,
    "act_functions": select_act_functions,
    "broadcast_operands": fold_broadcast_operands,
    "direct_copies": copy_directly,
    "dce": eliminate_dead_code,
    "retile": retile_nests,
    "tile_order": order_tiles,
    "epilogues": fuse_epilogues,
    "pipeline": pipeline_loops,
    "invariant_loads": hoist_invariant_loads,
    "forward": forward_tiles,
    "act_operands": fold_act_operands,
}
# Each pass's options and their types (a bool is written 0/1 or false/true).
OPTIONS: dict[str, dict[str, type]] = {
    "pipeline": {"num_stages": int, "widen": bool, "check_order": bool},
    "retile": {"min_tiles": int, "min_width": int},
    "tile_order": {"max_row_block": int},
    "forward": {"max_bytes": int, "affine_tails": bool},
    "epilogues": {"row_wise": bool},
}
# The least value an int option accepts: retile's tiles below 32 elements a partition multiply
# the instruction count for no overlap (one-element tiles took gelu's compile from 2 s to 6 min).
MINIMUM: dict[tuple[str, str], int] = {("retile", "min_tiles"): 1, ("retile", "min_width"): 32,
                                        ("tile_order", "max_row_block"): 1}
DEFAULT_PASSES = ("fusion", "cse", "act_functions", "broadcast_operands", "dce", "retile", "tile_order",
                  "epilogues", "pipeline", "invariant_loads", "forward", "direct_copies", "act_operands",
                  "dce")


def pass_list(text: str, optlevel: int) -> list[str]:
    """The passes to run: `text` ('a,b{k=v}', or 'none') when given, else the optlevel's default."""
    if not text:
        return list(DEFAULT_PASSES) if optlevel >= 1 else []
    if text.strip() == "none":
        return []
    try:
        items = split_pipeline(text)
    except ValueError as err:
        raise CompileError("E400", f"{err} in Penguin pass list {text!r}", "--penguin-passes") from None
    for item in items:
        parse_pass(item)
    return items


def parse_pass(item: str) -> tuple[str, dict[str, object]]:
    """'name{k=v,...}' -> (name, typed options); E400 for an unknown name or option."""
    name, _, rest = item.partition("{")
    name = name.strip()
    if name not in PASSES:
        raise CompileError("E400", f"unknown Penguin pass '{name}' (known: {', '.join(PASSES)})",
                           "--penguin-passes")
    if rest and not rest.endswith("}"):
        raise CompileError("E400", f"malformed options of Penguin pass '{item}'", "--penguin-passes")
    options: dict[str, object] = {}
    for pair in filter(None, (p.strip() for p in rest[:-1].split(","))) if rest else []:
        key, _, value = (part.strip() for part in pair.partition("="))
        kind = OPTIONS.get(name, {}).get(key)
        if kind is None:
            raise CompileError("E400", f"Penguin pass '{name}' has no option '{key}'", "--penguin-passes")
        if kind is bool and value.lower() in ("0", "false", "1", "true"):
            options[key] = value.lower() in ("1", "true")
        elif kind is int and value.lstrip("-").isdigit():
            options[key] = int(value)
        else:
            raise CompileError("E400", f"option {key} of Penguin pass '{name}' takes a value of type "
                                       f"{kind.__name__}, got '{value}'", "--penguin-passes")
        least = MINIMUM.get((name, key))
        if least is not None and options[key] < least:
            raise CompileError("E400", f"option {key} of Penguin pass '{name}' must be at least {least}, got "
                                       f"{options[key]}", "--penguin-passes")
    return name, options


def optimize(program: penguin_pb2.Program, passes: list[str], num_stages: int = 0) -> None:
    """Run `passes` in order; `num_stages` (--num-stages) is the pipeline pass's default. A program
    with Repeat regions (while loops kept as loops) is optimized a segment at a time (segments.py)."""
    if program.repeats and passes:
        optimize_segments(program, lambda segment: _run_passes(segment, passes, num_stages))
    else:
        _run_passes(program, passes, num_stages)


def _run_passes(program: penguin_pb2.Program, passes: list[str], num_stages: int) -> None:
    for item in passes:
        name, options = parse_pass(item)
        if name == "pipeline":
            options.setdefault("num_stages", num_stages)
        stats = PASSES[name](program, **options)
        print(f"penguin-opt: {name}: {stats}", file=sys.stderr)
