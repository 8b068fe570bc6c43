"""Affine expressions and predicates of Penguin IR: building them and evaluating them at a point.

Shared by the producer of Penguin (hlo2penguin) and its consumers (hlo_opt), so that both read
the IR the same way.
"""

from __future__ import annotations

from collections.abc import Mapping

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


Compiled = tuple[tuple[tuple[str, int], ...], int]  # ((var, coeff), ...), constant


def compiled(expr: penguin_pb2.AffineExpr) -> Compiled:
    """An expression as plain tuples, for evaluating it at many points (`evaluate_compiled`)."""
    return tuple((term.var, term.coeff) for term in expr.terms), expr.constant


def evaluate_compiled(expr: Compiled, point: Mapping[str, int]) -> int:
    terms, constant = expr
    return constant + sum(coeff * point[var] for var, coeff in terms)


def to_text(affine: penguin_pb2.AffineExpr) -> str:
    parts = [f"{term.coeff}*{term.var}" if term.coeff != 1 else term.var for term in affine.terms]
    if affine.constant or not parts:
        parts.append(str(affine.constant))
    return " + ".join(parts)
