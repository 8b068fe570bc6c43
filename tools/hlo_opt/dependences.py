"""Dependences of one loop nest with ISL, and whether a new schedule keeps every one of them.

Used by the passes that reorder a nest's iterations (software pipelining shifts stages; tile_order
strip-mines and interchanges loops): each states its new schedule per statement, and the nest is
changed only when no RAW/WAR/WAW dependence is reversed.

Statement k's instances are S_k[axes] within the axes' bounds and its predicates; the original
schedule is [axes, k]. Accesses are affine boxes: an HBM access touches elements of its base
tensor (view offset + strides), an on-chip access elements of its tensor (each block is its own
buffer, so logical positions are distinct memory). A dependence is a pair of instances touching a
common element, at least one writing, the first before the second in the original schedule; the
new schedule must put every such pair in the same order.
"""

from __future__ import annotations

import re
from collections.abc import Callable
from dataclasses import dataclass

from ncc.schemas import common_pb2, penguin_pb2
from ncc.tools.common import affine
from ncc.tools.common.errors import CompileError

_KEEPS_ALL: set[tuple] = set()  # questions first_reversed_dependence answered None (one process)


@dataclass
class Violation:
    kind: str  # RAW, WAR or WAW
    source: int  # statement indices
    sink: int
    tensor: str
    dependence: str  # the violated part of the dependence, as an ISL relation
    first: tuple[tuple[int, ...], tuple[int, ...]]  # the first violated (source, sink) iteration pair


def axis_names(nest: penguin_pb2.LoopNest) -> list[str]:
    """The ISL names of the nest's axes, outermost first (a0, a1, ...)."""
    return [f"a{k}" for k in range(len(nest.axes))]


def first_reversed_dependence(nest: penguin_pb2.LoopNest, tensors: dict[str, penguin_pb2.TensorDecl],
                              schedule: list[str],
                              keeps_order: Callable[[int, int], bool] | None = None) -> Violation | None:
    """The dependence `schedule` reverses first, or None when it keeps all of them.

    `schedule[k]` is statement k's new schedule point as ISL tuple text over the axis names
    (`axis_names`), e.g. "a0, floor(a1/4), a2, a1 mod 4, 3"; the tuples are compared
    lexicographically. `keeps_order(k1, k2)`, when it says so, skips a pair of statements the caller
    knows the new schedule orders as the old one did.
    """
    import islpy as isl

    names = axis_names(nest)
    var = {axis.name: name for axis, name in zip(nest.axes, names, strict=True)}
    point = ", ".join(names)
    bounds = [f"0 <= {name} < {axis.extent}" for axis, name in zip(nest.axes, names, strict=True)]
    domains: list[str] = []
    memories: dict[tuple, str] = {}
    texts: list[tuple[int, bool, str, str, str]] = []  # (statement, write, memory, relation, tensor)
    for k, st in enumerate(nest.statements):
        domains.append(" and ".join(bounds + [predicate_text(p, var) for p in st.predicates]))
        for write, access in [*((True, a) for a in st.outputs), *((False, a) for a in st.inputs)]:
            key, text = access_text(access, tensors, var)
            memory = memories.setdefault(key, f"M{len(memories)}")
            texts.append((k, write, memory, text, access.tensor))
    # The question in ISL's terms names no tensor (memories are M0, M1, ... in order of first use),
    # so nests of one shape (a model's layers) ask it once: a schedule found to keep every
    # dependence is remembered by that text.
    question = (tuple(schedule), tuple(domains), tuple(t[:4] for t in texts))
    if keeps_order is None and question in _KEEPS_ALL:
        return None
    original, changed = {}, {}
    for k, domain in enumerate(domains):
        original[k] = isl.Map(f"{{ S{k}[{point}] -> [{point}, {k}] : {domain} }}")
        changed[k] = isl.Map(f"{{ S{k}[{point}] -> [{schedule[k]}] : {domain} }}")
    accesses: dict[str, list[tuple[int, bool, object, str]]] = {}
    for k, write, memory, text, tensor in texts:
        relation = isl.Map(f"{{ S{k}[{point}] -> {memory}{text} and {domains[k]} }}")
        accesses.setdefault(memory, []).append((k, write, relation, tensor))
    found: list[tuple[tuple, Violation]] = []
    for group in accesses.values():
        for k1, write1, map1, tensor in group:
            for k2, write2, map2, _ in group:
                if not (write1 or write2) or (keeps_order is not None and keeps_order(k1, k2)):
                    continue
                dependence = map1.apply_range(map2.reverse()).intersect(original[k1].lex_lt_map(original[k2]))
                if dependence.is_empty():
                    continue
                reversed_ = dependence.intersect(changed[k2].lex_le_map(changed[k1]).reverse())
                if reversed_.is_empty():
                    continue
                sample = reversed_.wrap().lexmin().sample_point()
                coords = [sample.get_coordinate_val(isl.dim_type.set, d).to_python()
                          for d in range(2 * len(names))]
                first = (tuple(coords[:len(names)]), tuple(coords[len(names):]))
                kind = "WAW" if write1 and write2 else "RAW" if write1 else "WAR"
                text = readable(str(reversed_.coalesce()), nest)
                found.append(((*first[0], k1, *first[1], k2),
                              Violation(kind, k1, k2, tensor, text, first)))
    if not found and keeps_order is None:
        _KEEPS_ALL.add(question)
    return min(found, key=lambda item: item[0])[1] if found else None


def instance(nest: penguin_pb2.LoopNest, k: int, at: tuple[int, ...]) -> str:
    """Statement k at iteration `at`, as `name[axis=value, ...]`."""
    values = ", ".join(f"{axis.name}={v}" for axis, v in zip(nest.axes, at, strict=True))
    return f"{nest.statements[k].name}[{values}]"


def _expr_text(expr: penguin_pb2.AffineExpr, var: dict[str, str]) -> str:
    parts = [f"{t.coeff}*{var[t.var]}" for t in expr.terms if t.coeff]
    return " + ".join([*parts, str(expr.constant)])


def predicate_text(predicate: penguin_pb2.Predicate, var: dict[str, str]) -> str:
    if any(t.var not in var for t in predicate.expr.terms):
        raise CompileError("E301", "a predicate names a variable that is not an axis of its nest")
    relation = "=" if predicate.relation == penguin_pb2.EQ else ">="
    return f"{_expr_text(predicate.expr, var)} {relation} 0"


def access_text(access: penguin_pb2.Access, tensors: dict[str, penguin_pb2.TensorDecl],
                var: dict[str, str]) -> tuple[tuple, str]:
    """(which memory, the access relation's range and constraints): HBM as a linear element address
    of the base tensor, on chip as the tensor's logical element position."""
    tensor = tensors.get(access.tensor)
    if tensor is None or len(access.starts) != len(tensor.shape) or len(access.extents) != len(tensor.shape):
        raise CompileError("E301", f"access to '{access.tensor}' does not match a declared tensor",
                           access.tensor)
    starts = [f"({_expr_text(s, var)})" for s in access.starts]
    if tensor.memory != common_pb2.HBM:
        dims = [f"x{d}" for d in range(len(starts))]
        boxes = enumerate(zip(starts, access.extents, tensor.shape, strict=True))
        constraints = [f"{s} <= x{d} < {s} + {e} and 0 <= x{d} < {size}" for d, (s, e, size) in boxes]
        return ("chip", tensor.name), f"[{', '.join(dims)}] : {' and '.join(constraints)}"
    if tensor.view_of:
        base, offset, strides = tensor.view_of, tensor.view_offset, list(tensor.view_strides)
    else:
        base, offset, strides = tensor.name, 0, list(affine.row_major_strides(tensor.shape))
    local = [f"e{d}" for d in range(len(starts))]
    constraints = [f"0 <= e{d} < {e} and 0 <= {s} + e{d} < {size}"
                   for d, (s, e, size) in enumerate(zip(starts, access.extents, tensor.shape, strict=True))]
    address = " + ".join([str(offset), *(f"{stride}*({s} + e{d})" for d, (s, stride)
                                          in enumerate(zip(starts, strides, strict=True)) if stride)])
    return ("hbm", base), (f"[x] : exists ({', '.join(local)} : {' and '.join(constraints)} and "
                           f"x = {address})")


def readable(text: str, nest: penguin_pb2.LoopNest) -> str:
    """An ISL relation with the nest's axis and statement names in place of a0.. and S0.."""
    text = re.sub(r"\ba(\d+)(?=\W|$)", lambda m: nest.axes[int(m.group(1))].name, text)
    return re.sub(r"\bS(\d+)\[", lambda m: f"{nest.statements[int(m.group(1))].name}[", text)
