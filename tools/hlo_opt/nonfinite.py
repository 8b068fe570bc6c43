"""Which tensors of a Penguin program may hold ±inf or NaN by construction.

`forward` transposes intermediates on PE, as a matmul against an identity, which is exact for
finite values only: an inf or a NaN in the tile turns its whole column into NaNs (inf · 0). A
program that puts a non-finite value into a tensor on purpose — a −inf fill for a mask
(`jnp.where(m, x, -jnp.inf)`), a constant holding inf or NaN — would then compute NaN where XLA
computes numbers, so `forward` leaves such tensors, and everything computed from them, to the HBM
round trip, which moves bytes exactly.

A tensor is flagged when a statement that writes it has a non-finite scalar (a fill, a
tensor_scalar), is *singular* — computes exp, expm1, log, log1p, sqrt, rsqrt, a division by a
tensor, power or remainder where finite operands can make it ±inf or NaN (`_Signs`: not a
softmax's exp(x - max(x)), which is at most 1, nor its division by the row sum, at least 1, nor a
norm's sqrt or rsqrt of var + eps) — or reads a flagged tensor or a constant holding a non-finite
value; HBM views share their base tensor's flag. `log(relu(x)) @ w` with an all-negative row, or
a division by a row norm that can be 0, would otherwise turn every row of the dot into NaN.

Not flagged, so still transposed on PE (docs/ir.md): kernel inputs that hold inf or NaN, and
sums and products that overflow past 3.4e38.
"""

from __future__ import annotations

import math
from collections.abc import Callable

import numpy as np

from ncc.schemas import penguin_pb2
from ncc.tools.common.dtypes import is_float, storage_dtype, to_compute

# A program attribute: tensors already flagged in the program a segment of it was cut from
# (segments.py), comma-separated, which the segment alone cannot see written.
SEEDED = "nonfinite"


def nonfinite_tensors(program: penguin_pb2.Program) -> set[str]:
    """The names of the tensors (HBM views by their base) that may hold ±inf or NaN by construction."""
    tensors = {t.name: t for t in program.tensors}

    def base(name: str) -> str:
        while tensors[name].view_of:
            name = tensors[name].view_of
        return name

    signs = _Signs(program, base)
    flagged = {t.name for t in program.tensors if t.role == penguin_pb2.CONSTANT and _holds_nonfinite(t)}
    flagged |= set(filter(None, program.attributes.get(SEEDED, "").split(",")))
    changed = True
    while changed:  # program order is producers first; a second pass settles anything else
        changed = False
        for nest in program.nests:
            for st in nest.statements:
                if not (any(not math.isfinite(x) for x in st.scalars)
                        or signs.singular(st)
                        or any(base(a.tensor) in flagged for a in st.inputs)):
                    continue
                for access in st.outputs:
                    name = base(access.tensor)
                    if name not in flagged:
                        flagged.add(name)
                        changed = True
    return flagged


NONPOS, NONNEG, POS = "<= 0", ">= 0", "> 0"  # POS: bounded away from 0 (a sum holding a 1, x + eps)
ZERO = "0"  # ACT's x · 0


class _Signs:
    """What each tensor's values are known to be, for finite inputs, from the statements that write
    it: enough to see that a softmax's exp(x - max(x)) is at most 1, its row sum at least 1, and a
    norm's var + eps positive, so that exp, divide, sqrt, rsqrt and log there make nothing
    non-finite. Every other exp, expm1, divide by a tensor, sqrt, rsqrt, log, log1p, power and
    remainder is *singular*: finite operands can make it ±inf or NaN (exp(89), x/0, log(0))."""

    def __init__(self, program: penguin_pb2.Program, base: Callable[[str], str]) -> None:
        self.base = base
        self.sign: dict[str, str | None] = {}
        self.row_max_of: dict[str, str] = {}  # a tensor_reduce maximum's output -> its input
        self.shifted: set[str] = set()  # x - max(x): <= 0, and 0 at each row's max
        self.peaked: set[str] = set()  # exp(x - max(x)): in [0, 1], and 1 at each row's max
        for nest in program.nests:
            for st in nest.statements:
                if len(st.outputs) == 1:
                    self._learn(st, base(st.outputs[0].tensor))

    def _of(self, st: penguin_pb2.Statement, k: int) -> str | None:
        return self.sign.get(self.base(st.inputs[k].tensor)) if k < len(st.inputs) else None

    def _learn(self, st: penguin_pb2.Statement, out: str) -> None:
        ins = [self.base(a.tensor) for a in st.inputs]
        fact, shifted, peaked = None, False, False
        if st.op in ("dma", "tensor_copy") and len(ins) == 1:
            fact, shifted, peaked = self.sign.get(ins[0]), ins[0] in self.shifted, ins[0] in self.peaked
        elif st.op == "tensor_reduce" and st.func == "maximum" and len(ins) == 1:
            self.row_max_of[out] = ins[0]
            fact = self.sign.get(ins[0])
        elif st.op == "tensor_reduce" and st.func == "add" and len(ins) == 1:
            fact = POS if ins[0] in self.peaked or self.sign.get(ins[0]) == POS else (
                NONNEG if self.sign.get(ins[0]) == NONNEG else None)
        elif st.op == "tensor_tensor" and st.func == "subtract" and len(ins) == 2:
            shifted = self.row_max_of.get(ins[1]) == ins[0]
            fact = NONPOS if shifted else None
        elif st.op == "tensor_tensor" and st.func == "multiply" and len(ins) == 2:
            signs = {self._of(st, 0), self._of(st, 1)}
            fact = NONNEG if ins[0] == ins[1] else (POS if signs == {POS} else (
                NONNEG if signs <= {POS, NONNEG} else None))
        elif st.op == "tensor_scalar" and len(ins) == 1 and st.scalars and "reverse" not in st.attributes:
            fact = _scaled(self.sign.get(ins[0]), st.func, st.scalars[0])
        elif st.op == "activation" and len(ins) == 1:
            argument = self._argument(st)
            if st.func in ("exp", "square", "abs", "relu", "sqrt"):
                fact = POS if st.func == "sqrt" and argument == POS else NONNEG
                peaked = st.func == "exp" and ins[0] in self.shifted and list(st.scalars[1:2]) in ([], [0.0])
            elif st.func == "rsqrt" and argument == POS:
                fact = POS
        agreed = out not in self.sign or self.sign[out] == fact  # every writer must agree
        self.sign[out] = fact if agreed else None
        for known, holds in ((self.shifted, shifted), (self.peaked, peaked)):
            if holds and agreed:
                known.add(out)
            else:
                known.discard(out)

    def _argument(self, st: penguin_pb2.Statement) -> str | None:
        """The sign of ACT's func argument, in0 · scale + bias (one input: no operand bias)."""
        scale = st.scalars[0] if st.scalars else 1.0
        bias = st.scalars[1] if len(st.scalars) > 1 else 0.0
        x = self._of(st, 0)
        if scale == 0:
            term = ZERO
        elif scale > 0:
            term = x
        else:  # the product's sign is the opposite of x's
            term = {NONPOS: NONNEG, NONNEG: NONPOS, POS: NONPOS}.get(x) if x else None
        if term in (ZERO, NONNEG, POS) and bias > 0:
            return POS
        if term in (NONNEG, POS) and bias == 0:
            return term
        if term in (ZERO, NONPOS) and bias <= 0:
            return NONPOS
        return None

    def singular(self, st: penguin_pb2.Statement) -> bool:
        """Whether finite operands can make this statement's result ±inf or NaN."""
        if st.func in ("power", "remainder"):
            return True
        if st.op == "activation":
            argument = self._argument(st) if len(st.inputs) == 1 else None
            safe = {"exp": (NONPOS,), "expm1": (NONPOS,), "log": (POS,), "log1p": (NONNEG, POS),
                    "sqrt": (NONNEG, POS), "rsqrt": (POS,)}.get(st.func)
            return safe is not None and argument not in safe
        if st.func == "divide" and st.op == "tensor_tensor":
            return self._of(st, 1) != POS
        if st.func == "divide" and st.op == "tensor_scalar":
            by_tensor = "reverse" in st.attributes  # scalar / x
            return (by_tensor and self._of(st, 0) != POS) or not all(st.scalars[:1])
        return False


def _scaled(sign: str | None, func: str, scalar: float) -> str | None:
    """The sign of x <func> scalar for x of `sign`."""
    if func == "add" and sign in (NONNEG, POS) and scalar > 0:
        return POS
    if func == "add" and scalar == 0 or func in ("multiply", "divide") and scalar > 0:
        return sign
    if func == "maximum" and scalar >= 0:
        return POS if scalar > 0 else NONNEG
    return None


def _holds_nonfinite(tensor: penguin_pb2.TensorDecl) -> bool:
    if not is_float(tensor.dtype) or not tensor.data:
        return False
    values = to_compute(np.frombuffer(tensor.data, dtype=storage_dtype(tensor.dtype)), tensor.dtype)
    return not bool(np.isfinite(values).all())
