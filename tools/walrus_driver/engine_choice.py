"""The other engines an instruction may run on, and its form there.

A dma's trigger engine only issues it: any engine that assign_hwdge_engine gave a pool of queues
can trigger a store instead (`trigger_alternatives`), and pre_sched picks the one whose issue lets
the transfer finish first. An indirect dma stays on POOL, whose software DGE writes its descriptors.

Compute: which DVE instructions have an exact equivalent on ACT (`act_equivalent`).

The frontend puts every elementwise instruction on DVE. ACT computes func(in·scale + bias) in
fp32 (docs/ir.md), so these DVE instructions give bit for bit the same result there:
  * tensor_scalar multiplying, adding or subtracting a float scalar: x·s + 0 = x·s,
    x·1 + s = x + s, x + (−s) = x − s and (−1)·x + s = s − x are exact in IEEE arithmetic (up to
    the sign of a zero result, which compares equal); maximum with 0 is relu;
  * tensor_tensor multiplying an operand by itself is square (x·x);
  * tensor_copy is allowed on ACT as it is.
pre_sched offers such an instruction to both engines and keeps the one that finishes it first,
so elementwise work that would queue on DVE spreads onto ACT.
"""

from __future__ import annotations

from ncc.schemas import bir_pb2, common_pb2
from ncc.tools.common import dtypes
from ncc.tools.walrus_driver import birutil

ACT = common_pb2.ACT
DVE = common_pb2.DVE
HWDGE_ENGINES = frozenset({common_pb2.SP, ACT, DVE})  # the engines with a hardware DMA trigger


def trigger_alternatives(dma: bir_pb2.Instruction, engines: list[int]) -> list[bir_pb2.Instruction]:
    """Copies of a hardware store triggered by each of `engines` other than its own. Loads keep
    their engine: most are ready at the start, where the first free engine is a compute engine
    that their issue would then delay (offering loads too took cnn_train from 123 to 146 µs)."""
    if dma.op != "dma" or dma.waits or dma.updates or birutil.dma_direction(dma) != "store":
        return []
    forms = []
    for engine in engines:
        if engine != dma.engine:
            form = bir_pb2.Instruction()
            form.CopyFrom(dma)
            form.engine = engine
            forms.append(form)
    return forms


def act_equivalent(instr: bir_pb2.Instruction) -> bir_pb2.Instruction | None:
    """A copy of the DVE instruction rewritten to run on ACT with the same result, or None when it
    has none (other ops and functions, integer operands, semaphores already attached)."""
    op = instr.op
    if op not in ("tensor_scalar", "tensor_tensor", "tensor_copy") or instr.engine != DVE:
        return None
    if instr.waits or instr.updates or len(instr.outputs) != 1:
        return None
    if op == "tensor_copy":
        moved = bir_pb2.Instruction()
        moved.CopyFrom(instr)
        moved.engine = ACT
        return moved
    if not all(dtypes.is_float(ap.dtype) for ap in (*instr.inputs, *instr.outputs)):
        return None
    if op == "tensor_tensor" and instr.func == "multiply" and len(instr.inputs) == 2:
        if instr.inputs[0] != instr.inputs[1]:
            return None
        return _activation(instr, "square", (1.0, 0.0))
    if op != "tensor_scalar" or len(instr.scalars) != 1 or len(instr.inputs) != 1:
        return None
    scalar = instr.scalars[0]
    reverse = instr.attributes.get("reverse") == "1"
    if instr.func == "maximum" and scalar == 0.0:
        return _activation(instr, "relu", (1.0, 0.0))
    scale_bias = {
        "multiply": (scalar, 0.0),
        "add": (1.0, scalar),
        "subtract": (-1.0, scalar) if reverse else (1.0, -scalar),
    }.get(instr.func)
    return None if scale_bias is None else _activation(instr, "identity", scale_bias)


def _activation(
    instr: bir_pb2.Instruction, func: str, scale_bias: tuple[float, float]
) -> bir_pb2.Instruction:
    """`instr` as ACT's func(in0·scale + bias), its first input only."""
    moved = bir_pb2.Instruction()
    moved.CopyFrom(instr)
    moved.op, moved.engine, moved.func = "activation", ACT, func
    del moved.inputs[1:]
    del moved.scalars[:]
    moved.scalars.extend(scale_bias)
    moved.attributes.pop("reverse", None)
    return moved
