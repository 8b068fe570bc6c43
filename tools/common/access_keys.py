"""Keys that say when two Penguin accesses read the same data: the Penguin passes (tools/hlo_opt) and
the instruction budget (penguin_budget: a load several nests repeat survives the optimizer once)
compare with these.

An HBM tensor declaration reads its base through an offset and strides (a view) or whole; a box
is its per-dimension affine starts and extents. Axis names can differ between nests, so box keys
take a renaming.
"""

from __future__ import annotations

from ncc.schemas import penguin_pb2


def base(tensors: dict[str, penguin_pb2.TensorDecl], name: str) -> str:
    """The HBM tensor a declaration names (itself, or what it is a view of)."""
    return tensors[name].view_of or name


def view_key(tensor: penguin_pb2.TensorDecl) -> tuple:
    """What an HBM tensor declaration reads: its base, dtype, shape, offset and strides."""
    return (tensor.view_of or tensor.name, tensor.dtype, tuple(tensor.shape), tensor.view_offset,
            tuple(tensor.view_strides))


def box_key(access: penguin_pb2.Access, rename: dict[str, str] | None = None,
            fixed: frozenset[str] = frozenset()) -> tuple:
    """An access's box, with its axis names renamed by `rename`; terms in the axes `fixed` (of
    extent 1, so always 0) are left out."""
    rename = rename or {}
    starts = tuple((tuple(sorted((rename.get(t.var, t.var), t.coeff) for t in s.terms
                                 if t.coeff and rename.get(t.var, t.var) not in fixed)),
                    s.constant) for s in access.starts)
    return starts, tuple(access.extents)
