"""Affine expressions and predicates of Penguin IR: building them and evaluating them at a point.

Shared by the producer of Penguin (hlo2penguin) and its consumers (hlo_opt), so that both read
the IR the same way.
"""

from __future__ import annotations

import functools
from collections.abc import Callable, Mapping, Sequence

from ncc.schemas import penguin_pb2


def row_major_strides(shape) -> tuple[int, ...]:
    """Element strides of a dense row-major layout: the affine map from an index to an offset."""
    strides, step = [], 1
    for size in reversed(tuple(shape)):
        strides.append(step)
        step *= int(size)
    return tuple(reversed(strides))


def expr(terms: Mapping[str, int] | None = None, constant: int = 0) -> penguin_pb2.AffineExpr:
    """sum(coeff * var for var, coeff in terms) + constant, dropping zero coefficients."""
    result = penguin_pb2.AffineExpr(constant=constant)
    for var, coeff in (terms or {}).items():
        if coeff:
            result.terms.add(var=var, coeff=coeff)
    return result


def evaluate(affine: penguin_pb2.AffineExpr, point: Mapping[str, int]) -> int:
    return affine.constant + sum(term.coeff * point[term.var] for term in affine.terms)


def equals(var: str, value: int) -> penguin_pb2.Predicate:
    """The predicate var == value."""
    return penguin_pb2.Predicate(expr=expr({var: 1}, -value), relation=penguin_pb2.EQ)


def at_least(var: str, value: int) -> penguin_pb2.Predicate:
    """The predicate var >= value."""
    return penguin_pb2.Predicate(expr=expr({var: 1}, -value), relation=penguin_pb2.GE)


def holds(predicate: penguin_pb2.Predicate, point: Mapping[str, int]) -> bool:
    return relation_holds(predicate.relation, evaluate(predicate.expr, point))


def relation_holds(relation: int, value: int) -> bool:
    """Whether `value` (a predicate's expression at a point) satisfies the predicate's relation."""
    if relation == penguin_pb2.EQ:
        return value == 0
    if relation == penguin_pb2.GE:
        return value >= 0
    raise ValueError(f"unknown predicate relation {relation}")


def _source(affine: penguin_pb2.AffineExpr, axes: Sequence[str]) -> str:
    """The expression as Python source over `p`, the point as a tuple of the axes' values."""
    index = {axis: position for position, axis in enumerate(axes)}
    parts = [str(int(affine.constant))]
    for term in affine.terms:
        if term.var not in index:
            raise KeyError(term.var)
        parts.append(f"{int(term.coeff)} * p[{index[term.var]}]")
    return " + ".join(parts)


def point_function(
    exprs: Sequence[penguin_pb2.AffineExpr], axes: Sequence[str]
) -> Callable[[tuple], list[int]]:
    """The values of `exprs` at a point (a tuple of the `axes`' values), as one compiled function.
    Unrolling evaluates every access's starts at every point of its nest (100k instructions for a
    stacked attention model): a generated expression runs several times faster than a walk of the
    terms. The source holds only integers and tuple indices. KeyError names a variable that is
    not an axis."""
    return _function(f"lambda p: [{', '.join(_source(affine, axes) for affine in exprs)}]")


def predicate_function(
    predicates: Sequence[penguin_pb2.Predicate], axes: Sequence[str]
) -> Callable[[tuple], bool]:
    """Whether every predicate holds at a point (a tuple of the `axes`' values), compiled as
    point_function is. ValueError for a relation other than EQ and GE."""
    tests = []
    for predicate in predicates:
        if predicate.relation == penguin_pb2.EQ:
            tests.append(f"({_source(predicate.expr, axes)}) == 0")
        elif predicate.relation == penguin_pb2.GE:
            tests.append(f"({_source(predicate.expr, axes)}) >= 0")
        else:
            raise ValueError(f"unknown predicate relation {predicate.relation}")
    return _function(f"lambda p: {' and '.join(tests) or 'True'}")


@functools.cache
def _function(source: str) -> Callable:
    """The function a generated lambda's source defines, compiled once per distinct source: the
    statements of a fused chain share a few expressions, and compiling one costs 30 µs."""
    return eval(source)  # noqa: S307 (integers and tuple indices only, see _source)


def to_text(affine: penguin_pb2.AffineExpr) -> str:
    parts = [f"{term.coeff}*{term.var}" if term.coeff != 1 else term.var for term in affine.terms]
    if affine.constant or not parts:
        parts.append(str(affine.constant))
    return " + ".join(parts)
