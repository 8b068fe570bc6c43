"""Which tensors of a Penguin program may hold ±inf or NaN by construction.

`forward` transposes intermediates on PE, as a matmul against an identity, which is exact for
finite values only: an inf or a NaN in the tile turns its whole column into NaNs (inf · 0). A
program that puts a non-finite value into a tensor on purpose — a −inf fill for a mask
(`jnp.where(m, x, -jnp.inf)`), a constant holding inf or NaN — would then compute NaN where XLA
computes numbers, so `forward` leaves such tensors, and everything computed from them, to the HBM
round trip, which moves bytes exactly.

A tensor is flagged when a statement that writes it has a non-finite scalar (a fill, a
tensor_scalar), computes a function with a singular point at ordinary values (log and log1p of 0
or less, power, remainder by 0: `log(relu(x))` is -inf wherever x <= 0), or reads a flagged tensor
or a constant holding a non-finite value; HBM views share their base tensor's flag.

Not flagged, so still transposed on PE (docs/ir.md): kernel inputs that hold inf or NaN, values
that overflow (a product or sum past 3.4e38, exp past 88.7), and divide, sqrt, rsqrt and exp. Those
four sit in every softmax and norm, where their operands keep them finite (exp(x - max) <= 1, a
sum of them >= 1, var + eps > 0); flagging them without proving that made the bundled attention
1.65x and block 2.0x slower (session 27), so a division by zero that reaches a PE transpose
still spreads NaN along its column.
"""

from __future__ import annotations

import math

import numpy as np

from ncc.schemas import penguin_pb2
from ncc.tools.common.dtypes import is_float, storage_dtype, to_compute

# A program attribute: tensors already flagged in the program a segment of it was cut from
# (segments.py), comma-separated, which the segment alone cannot see written.
SEEDED = "nonfinite"


# Functions that make ±inf or NaN out of finite operands at ordinary points: log(0), x/0, rsqrt(0),
# sqrt(-1), exp(89), pow(0, -1), fmod(x, 0). Sums and products overflow only past 3.4e38.
SINGULAR_FUNCS = frozenset({"log", "log1p", "power", "remainder"})


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
                        or st.func in SINGULAR_FUNCS
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
