"""The other engines an instruction may run on, and its form there.

A dma's trigger engine only issues it: any engine that assign_hwdge_engine gave a pool of queues
can trigger a store instead (`trigger_alternatives`), and pre_sched picks the one whose issue lets
the transfer finish first. An indirect dma stays on POOL, whose software DGE writes its descriptors.

Compute: which DVE instructions have an exact equivalent on ACT (`act_form`, `act_equivalent`).

The frontend puts every elementwise instruction on DVE. ACT computes func(in·scale + bias) in
fp32 (docs/ir.md), so these DVE instructions give bit for bit the same result there:
  * tensor_scalar multiplying, adding or subtracting a float scalar: x·s + (−0) = x·s,
    x·1 + s = x + s, x + (−s) = x − s and (−1)·x + s = s − x are exact in IEEE arithmetic, the
    sign of a zero result included (a bias of +0 would turn x·s = −0 into +0); maximum with 0 is
    relu; dividing by a power of two 2^k (|k| < 126) is multiplying by 2^-k, the same real number
    rounded once (BERT's scores / 8); other divisors give another rounding and stay;
  * tensor_tensor multiplying an operand by itself is square (x·x);
  * tensor_tensor multiplying a streamed operand by a per-partition one (a norm's x·rstd over its
    rows, a batch norm's scale over channel-major tiles) is identity(x·1·s + (−0)) with s as
    ACT's per-partition scale operand (`act_operand` = scale): x·1 is x, and adding −0 keeps
    every value x·s rounded once, a −0 included;
  * tensor_copy is allowed on ACT as it is.
pre_sched offers such an instruction to both engines and keeps the one that finishes it first,
so elementwise work that would queue on DVE spreads onto ACT.
"""

from __future__ import annotations

import math
from typing import NamedTuple

from ncc.schemas import bir_pb2, common_pb2
from ncc.tools.common.alu import ACT_OPERAND, IDENTITY_SCALE_BIAS
from ncc.tools.common.dtypes import is_float
from ncc.tools.walrus_driver.analysis import birutil

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


class ActForm(NamedTuple):
    """How a DVE instruction is rewritten to run on ACT with the same result, without copying it:
    pre_sched prices every candidate on ACT (CostTable.priced_as) but rewrites only those its
    kept schedule runs there (`apply`). `func` is None when the op stays as it is (tensor_copy).
    (A tuple: one is made per candidate, a third of an elementwise program.)"""

    op: str
    inputs: int | None = None  # the inputs it keeps, None for all (x·x as square(x) reads x once)
    func: str | None = None
    scale_bias: tuple[float, float] = IDENTITY_SCALE_BIAS
    scale_input: int = -1  # the input that becomes the per-partition scale operand (-1: none)

    def apply(self, instr: bir_pb2.Instruction) -> None:
        """Rewrite `instr` in place into this form: ACT's func(in0·scale + bias), or a move."""
        instr.engine = ACT
        if self.func is None:
            return
        instr.op, instr.func = self.op, self.func
        if self.scale_input >= 0:
            data, scale = (bir_pb2.AccessPattern(), bir_pb2.AccessPattern())
            data.CopyFrom(instr.inputs[1 - self.scale_input])
            scale.CopyFrom(instr.inputs[self.scale_input])
            del instr.inputs[:]
            instr.inputs.extend([data, scale])
            instr.attributes[ACT_OPERAND] = "scale"
        if self.inputs is not None:
            del instr.inputs[self.inputs :]
        del instr.scalars[:]
        instr.scalars.extend(self.scale_bias)
        instr.attributes.pop("reverse", None)


_MOVE = ActForm("tensor_copy")
_SQUARE = ActForm("activation", 1, "square")
_RELU = ActForm("activation", 1, "relu")
# tensor_scalar's functions with an ACT form (divide: by a power of two only)
_SCALAR_FUNCS = frozenset({"maximum", "multiply", "add", "subtract", "divide"})


def act_form(instr: bir_pb2.Instruction) -> ActForm | None:
    """The ACT form of a DVE instruction, or None when it has none (other ops and functions,
    integer operands, semaphores already attached). The cheap tests on op and function come
    first, and single operands are indexed rather than iterated: pre_sched asks this of every
    instruction, and most fail one of the first tests."""
    op = instr.op
    if op not in ("tensor_scalar", "tensor_tensor", "tensor_copy") or instr.engine != DVE:
        return None
    if op == "tensor_tensor":
        if instr.func != "multiply":
            return None
    elif op == "tensor_scalar":
        if instr.func not in _SCALAR_FUNCS or len(instr.scalars) != 1:
            return None
    if instr.waits or instr.updates:
        return None
    outputs = instr.outputs
    if len(outputs) != 1:
        return None
    if op == "tensor_copy":
        return _MOVE
    inputs = instr.inputs
    if op == "tensor_tensor":  # x·x is square(x); x·s, s per partition, is identity(x) scaled by s
        if len(inputs) != 2 or not (
            is_float(inputs[0].dtype) and is_float(inputs[1].dtype) and is_float(outputs[0].dtype)
        ):
            return None
        if inputs[0] == inputs[1]:
            return _SQUARE
        columns = [k for k in (0, 1) if birutil.per_partition(inputs[k])]
        if len(columns) != 1:
            return None
        return ActForm("activation", None, "identity", (1.0, -0.0), columns[0])
    if len(inputs) != 1 or not (is_float(inputs[0].dtype) and is_float(outputs[0].dtype)):
        return None
    scalar = instr.scalars[0]
    func = instr.func
    if func == "maximum":
        return _RELU if scalar == 0.0 else None
    if func == "multiply":
        scale_bias = (scalar, -0.0)  # adding −0 keeps every value, −0 included
    elif func == "add":
        scale_bias = (1.0, scalar)
    elif func == "divide":  # x / 2^k is x · 2^-k, the same real number rounded once; other divisors differ
        if instr.attributes.get("reverse") == "1" or not _exact_reciprocal(scalar):
            return None
        scale_bias = (1.0 / scalar, -0.0)
    elif instr.attributes.get("reverse") == "1":  # subtract, s − x
        scale_bias = (-1.0, scalar)
    else:
        scale_bias = (1.0, -scalar)
    return ActForm("activation", 1, "identity", scale_bias)


def _exact_reciprocal(scalar: float) -> bool:
    """Whether 1 / scalar is exact in float32: a power of two whose reciprocal is a normal float."""
    mantissa, exponent = math.frexp(scalar)
    return abs(mantissa) == 0.5 and -125 <= exponent <= 127


def act_equivalent(instr: bir_pb2.Instruction) -> bir_pb2.Instruction | None:
    """A copy of the DVE instruction rewritten to run on ACT with the same result, or None when it
    has none (act_form)."""
    form = act_form(instr)
    if form is None:
        return None
    moved = bir_pb2.Instruction()
    moved.CopyFrom(instr)
    form.apply(moved)
    return moved
