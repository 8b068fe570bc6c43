"""What the simulator agrees to load: every count and size in a NEFF, checked against the target
and a host memory budget before anything is allocated.

A NEFF can carry a valid checksum and still be hostile (or just wrong): tensors of [40000,40000]
or [1e11,1e11], access patterns of 60 dimensions or of a zero stride repeated billions of times,
2^28 semaphores, millions of instructions. Each must end as a CompileError naming the field, not
as a MemoryError, an int64 overflow or a run that never ends. Sizes are computed with Python
integers (no wrap-around). Codes: E603 the NEFF asks for more than the target has or allows;
E604 it fits the target but not this host's memory budget for simulation.

The budget is the smaller of half the memory available now, a quarter of the address-space limit
(RLIMIT_AS) when one is set, and NCC_SIM_MAX_BYTES when given.

What a NEFF executes is bounded separately, by a step limit (MAX_STEPS by default, `ncc run
--max-steps`): its loops are counted before anything runs (E605, tools/common/loops.py), so a
hostile trip count is refused at once instead of running for hours. A NEFF may hold at most
MAX_INSTRUCTIONS entries, the compiler's own budget (E603).
"""

from __future__ import annotations

import math
import os
import resource
from collections.abc import Iterable, Sequence

from ncc.schemas import bir_pb2
from ncc.tools.common import dtypes, loops
from ncc.tools.common.errors import CompileError
from ncc.tools.common.penguin_budget import MAX_INSTRUCTIONS
from ncc.tools.sim.memory import known_dtype
from ncc.tools.target import Target

MAX_DIMS = 8  # dims of an access pattern or a tensor shape
BUDGET_ENV = "NCC_SIM_MAX_BYTES"
# Executed instructions a run may take by default. The simulator runs about 25-60 us per executed
# instruction (bench/run_sim.py), and a loop's instances are created as they run, so memory does
# not grow with this number: 20M is a run of 10-20 minutes, twenty times the largest program the
# compiler's budget (MAX_INSTRUCTIONS) lets it unroll, room for rolled programs that repeat more;
# past it a run is more likely a hostile or mistaken trip count than a program anyone waits for.
MAX_STEPS = 20_000_000


def host_budget_bytes() -> int:
    """How many bytes of tensors and operand views one simulation may allocate on this host."""
    candidates = []
    try:
        candidates.append(os.sysconf("SC_AVPHYS_PAGES") * os.sysconf("SC_PAGE_SIZE") // 2)
    except (OSError, ValueError):
        pass
    soft, _ = resource.getrlimit(resource.RLIMIT_AS)
    if soft != resource.RLIM_INFINITY:
        candidates.append(soft // 4)
    given = os.environ.get(BUDGET_ENV, "")
    if given.strip().isdigit() and int(given) > 0:
        candidates.append(int(given))
    elif given:  # a typo must not silently leave the host's own limit in force
        raise CompileError("E604", f"{BUDGET_ENV}={given!r} is not a positive whole number of bytes")
    return min(candidates) if candidates else 1 << 32


def _size(what: str, dims: Sequence[int], itemsize: int) -> int:
    if len(dims) > MAX_DIMS:
        raise CompileError("E603", f"{what} has {len(dims)} dimensions (at most {MAX_DIMS})", what)
    if any(d < 0 for d in dims):
        raise CompileError("E603", f"{what} has a negative dimension", what)
    return math.prod(dims) * itemsize


def check_program(
    target: Target,
    hbm: Iterable[bir_pb2.HbmTensor],
    streams: Sequence[bir_pb2.Stream],
    num_semaphores: int,
    budget: int | None = None,
    layouts: Sequence[loops.Layout] | None = None,
) -> None:
    """Raise CompileError (E603/E604) for anything the simulator must not try to allocate or run.
    With loops (`layouts`, loops.plan_streams'), an entry inside loops is named as its first
    instance (`name@0,...`): the one that would fail first, all its instances being alike."""
    budget = host_budget_bytes() if budget is None else budget
    if not 0 <= num_semaphores <= target.num_semaphores:
        raise CompileError(
            "E603",
            f"the NEFF declares {num_semaphores} semaphores; "
            f"target {target.name} has {target.num_semaphores}",
        )
    instructions = sum(len(stream.instructions) for stream in streams)
    if instructions > MAX_INSTRUCTIONS:
        raise CompileError(
            "E603", f"the NEFF holds {instructions:,} instructions (at most {MAX_INSTRUCTIONS:,})"
        )
    total = 0
    for tensor in hbm:
        what = f"HBM tensor {tensor.name!r}"
        if not known_dtype(tensor.dtype):
            continue  # DeviceMemory names the bad dtype
        nbytes = _size(what, list(tensor.shape), dtypes.itemsize(tensor.dtype))
        if nbytes > target.hbm_bytes:
            raise CompileError(
                "E603",
                f"{what} needs {nbytes:,} bytes; target {target.name} has {target.hbm_bytes:,} of HBM",
                what,
            )
        total += nbytes
    if total > budget:
        raise CompileError(
            "E604", f"the NEFF's HBM tensors need {total:,} bytes; this host allows {budget:,} for simulation"
        )
    for number, stream in enumerate(streams):
        for entry, instruction in enumerate(stream.instructions):
            name = instruction.name
            if layouts is not None and layouts[number].loops[entry]:
                name = f"{name}@{','.join('0' * len(layouts[number].loops[entry]))}"
            for kind, operands in (("input", instruction.inputs), ("output", instruction.outputs)):
                for index, ap in enumerate(operands):
                    what = f"instruction {name!r} {kind} {index}"
                    if not known_dtype(ap.dtype):
                        continue
                    counts = [int(d.count) for d in ap.dims]
                    nbytes = _size(what, counts, dtypes.itemsize(ap.dtype)) * max(1, int(ap.partition_count))
                    if nbytes > budget:
                        raise CompileError(
                            "E604",
                            f"{what} spans {nbytes:,} bytes; this host allows {budget:,} for simulation",
                            what,
                        )
