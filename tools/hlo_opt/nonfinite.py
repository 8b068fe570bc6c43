"""Which tensors of a Penguin program may hold ±inf or NaN by construction.

`forward` transposes intermediates on PE, as a matmul against an identity, which is exact for
finite values only: an inf or a NaN in the tile turns its whole column into NaNs (inf · 0). A
program that puts a non-finite value into a tensor on purpose — a −inf fill for a mask
(`jnp.where(m, x, -jnp.inf)`), a constant holding inf or NaN — would then compute NaN where XLA
computes numbers, so `forward` leaves such tensors, and everything computed from them, to the HBM
round trip, which moves bytes exactly.

A tensor is flagged when a statement that writes it has a non-finite scalar (a fill, a
tensor_scalar), or reads a flagged tensor or a constant holding a non-finite value; HBM views
share their base tensor's flag. Kernel inputs count as finite: a NaN or inf that comes in with the
inputs and reaches a transposed intermediate still spreads along its column (docs/ir.md).
"""

from __future__ import annotations

import math

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

    flagged = {t.name for t in program.tensors if t.role == penguin_pb2.CONSTANT and _holds_nonfinite(t)}
    flagged |= set(filter(None, program.attributes.get(SEEDED, "").split(",")))
    changed = True
    while changed:  # program order is producers first; a second pass settles anything else
        changed = False
        for nest in program.nests:
            for st in nest.statements:
                if not (any(not math.isfinite(x) for x in st.scalars)
                        or any(base(a.tensor) in flagged for a in st.inputs)):
                    continue
                for access in st.outputs:
                    name = base(access.tensor)
                    if name not in flagged:
                        flagged.add(name)
                        changed = True
    return flagged


def _holds_nonfinite(tensor: penguin_pb2.TensorDecl) -> bool:
    if not is_float(tensor.dtype) or not tensor.data:
        return False
    values = to_compute(np.frombuffer(tensor.data, dtype=storage_dtype(tensor.dtype)), tensor.dtype)
    return not bool(np.isfinite(values).all())
