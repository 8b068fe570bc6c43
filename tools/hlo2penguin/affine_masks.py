"""Index arithmetic known at compile time, so that a mask built from iotas is never built at all.

A causal mask is written `jnp.tril(ones)` or `iota >= iota` and read by `where(mask, scores, -1e9)`:
in HLO a compare of two broadcast iotas, a select of constants around it, layout ops, and the
select over the scores. Lowered as written, every layer of a decoder computes the mask into HBM
(three nests), and every score tile loads its mask tile and streams it through POOL beside the
scores (a select reads two tiles). But the predicate is an affine function of the element's
position, which the engine can compute as it goes: NKI's `nki.isa.affine_select` keeps the tile's
element where `offset + partition · channel_multiplier + column · step >= 0` and writes a scalar
elsewhere, reading one tile.

This module follows the values that are such functions through the lowering (`Forms`): an
`IndexForm` is an integer value `const + Σ coeffs[d] · i[d]` over the value's index i (an iota, and
what broadcasts, reshapes that only add or drop unit dimensions, transposes, slices, reverses,
integer converts, adds, subtracts, negations and multiplies by constants make of it); a
`HalfSpace` is a predicate `const + Σ coeffs[d] · i[d] >= 0` (a compare of two IndexForms, and
what not, and, or, selects of constant predicates and the same layout ops make of it; a constant
predicate is one with no coefficients). The lowering asks `select_mask` whether a select's
predicate is a HalfSpace over its last two dimensions only, and then emits one `affine_select`
(tools/hlo2penguin/lower.py); the nests that computed the mask are left unread, and dce removes them.

Exactness: IndexForm arithmetic is done on Python integers, and a form is kept only while its
values over the whole shape fit the signed 32-bit range and its type is a signed integer of 32 or
64 bits, where HLO's wrapping arithmetic computes the same values.
"""

from __future__ import annotations

from dataclasses import dataclass

from ncc.schemas import common_pb2, hlo_pb2

_SIGNED_WIDE = frozenset({common_pb2.S32, common_pb2.S64})
_LIMIT = 1 << 31
_LAYOUT = frozenset({"broadcast", "reshape", "transpose", "slice", "reverse", "copy"})


@dataclass(frozen=True)
class IndexForm:
    """An integer value: const + Σ coeffs[d] · i[d] at index i."""

    coeffs: tuple[int, ...]
    const: int


@dataclass(frozen=True)
class HalfSpace:
    """A predicate: const + Σ coeffs[d] · i[d] >= 0 at index i (no coefficients: a constant)."""

    coeffs: tuple[int, ...]
    const: int

    @property
    def constant(self) -> bool | None:
        return (self.const >= 0) if not any(self.coeffs) else None


Form = IndexForm | HalfSpace


def constant_form(value: float, dtype: int, rank: int) -> Form | None:
    """The form of a compile-time scalar repeated over a shape of `rank` (a Splat)."""
    if dtype == common_pb2.PRED:
        return HalfSpace((0,) * rank, 0 if value else -1)
    if dtype in _SIGNED_WIDE and float(value).is_integer() and abs(value) < _LIMIT:
        return IndexForm((0,) * rank, int(value))
    return None


def _fits(form: IndexForm, shape: tuple[int, ...]) -> IndexForm | None:
    """`form` when its values over `shape` stay within the signed 32-bit range, else None."""
    reach = abs(form.const) + sum(abs(c) * (n - 1) for c, n in zip(form.coeffs, shape, strict=True))
    return form if reach < _LIMIT else None


def negated(form: HalfSpace) -> HalfSpace:
    """not (e >= 0) on integers: -e - 1 >= 0."""
    return HalfSpace(tuple(-c for c in form.coeffs), -form.const - 1)


def _linear(a: IndexForm, b: IndexForm, sign: int) -> IndexForm:
    coeffs = tuple(x + sign * y for x, y in zip(a.coeffs, b.coeffs, strict=True))
    return IndexForm(coeffs, a.const + sign * b.const)


def _moved(form: Form, coeffs: tuple[int, ...], const: int) -> Form:
    return type(form)(coeffs, const)


def _layout(instr: hlo_pb2.HloInstructionProto, form: Form, source: tuple[int, ...],
            shape: tuple[int, ...]) -> Form | None:
    """The form of a layout op's result from its operand's (`source`: the operand's shape)."""
    opcode, dims = instr.opcode, [int(d) for d in instr.dimensions]
    if opcode == "copy":
        return form
    if opcode == "broadcast":
        coeffs = [0] * len(shape)
        for k, d in enumerate(dims):
            coeffs[d] = form.coeffs[k]
        return _moved(form, tuple(coeffs), form.const)
    if opcode == "transpose":
        return _moved(form, tuple(form.coeffs[d] for d in dims), form.const)
    if opcode == "reverse":  # i -> n - 1 - i along the reversed dimensions
        coeffs, const = list(form.coeffs), form.const
        for d in dims:
            const += coeffs[d] * (source[d] - 1)
            coeffs[d] = -coeffs[d]
        return _moved(form, tuple(coeffs), const)
    if opcode == "slice":  # i -> start + i * stride
        coeffs, const = list(form.coeffs), form.const
        for d, s in enumerate(instr.slice_dimensions):
            const += coeffs[d] * s.start
            coeffs[d] *= s.stride or 1
        return _moved(form, tuple(coeffs), const)
    # a reshape that only adds or drops dimensions of one element keeps the others (the index
    # along a dimension of one element is 0, whatever its coefficient)
    if [n for n in source if n != 1] != [n for n in shape if n != 1]:
        return None
    it = iter([c for c, n in zip(form.coeffs, source, strict=True) if n != 1])
    return _moved(form, tuple(next(it) if n != 1 else 0 for n in shape), form.const)


def form_of(instr: hlo_pb2.HloInstructionProto, operands: list[Form | None], shape: tuple[int, ...],
            dtype: int, sources: list[tuple[int, ...]]) -> Form | None:
    """The form of `instr`'s result (of `shape` and `dtype`), from its operands' forms (None where
    an operand has none) and shapes (`sources`); None when it is not one."""
    opcode = instr.opcode
    if opcode == "iota":
        if dtype not in _SIGNED_WIDE:
            return None
        coeffs = [0] * len(shape)
        coeffs[int(instr.dimensions[0])] = 1
        return _fits(IndexForm(tuple(coeffs), 0), shape)
    if not operands or any(form is None for form in operands):
        return None
    if opcode in _LAYOUT:
        return _layout(instr, operands[0], sources[0], shape)
    if dtype == common_pb2.PRED:
        return _predicate(instr, operands)
    if dtype not in _SIGNED_WIDE or not all(isinstance(form, IndexForm) for form in operands):
        return None
    if opcode == "convert":
        return _fits(operands[0], shape)
    if opcode in ("add", "subtract"):
        return _fits(_linear(operands[0], operands[1], 1 if opcode == "add" else -1), shape)
    if opcode == "negate":
        form = operands[0]
        return IndexForm(tuple(-c for c in form.coeffs), -form.const)
    if opcode == "multiply":
        a, b = operands
        if any(a.coeffs) and any(b.coeffs):
            return None  # a product of two indices is not affine
        scale, form = (a.const, b) if not any(a.coeffs) else (b.const, a)
        return _fits(IndexForm(tuple(c * scale for c in form.coeffs), form.const * scale), shape)
    return None


def _predicate(instr: hlo_pb2.HloInstructionProto, operands: list[Form]) -> HalfSpace | None:
    opcode = instr.opcode
    if opcode == "compare":
        a, b = operands
        if not (isinstance(a, IndexForm) and isinstance(b, IndexForm)):
            return None
        difference = _linear(a, b, -1)  # a - b
        direction = instr.comparison_direction
        if direction == "GE":
            return HalfSpace(difference.coeffs, difference.const)
        if direction == "GT":
            return HalfSpace(difference.coeffs, difference.const - 1)
        reverse = IndexForm(tuple(-c for c in difference.coeffs), -difference.const)  # b - a
        if direction == "LE":
            return HalfSpace(reverse.coeffs, reverse.const)
        if direction == "LT":
            return HalfSpace(reverse.coeffs, reverse.const - 1)
        return None
    if not all(isinstance(form, HalfSpace) for form in operands):
        return None
    if opcode == "not":
        return negated(operands[0])
    if opcode == "convert":
        return operands[0]
    if opcode in ("and", "or"):
        a, b = operands
        known = a.constant if a.constant is not None else b.constant
        other = b if a.constant is not None else a
        if known is None:
            return None  # two half-spaces together are not one
        if opcode == "and":
            return other if known else HalfSpace((0,) * len(other.coeffs), -1)
        return other if not known else HalfSpace((0,) * len(other.coeffs), 0)
    if opcode == "select":
        condition, on_true, on_false = operands
        if on_true.constant is None or on_false.constant is None:
            return None
        if on_true.constant == on_false.constant:
            return on_true
        return condition if on_true.constant else negated(condition)
    return None


def select_mask(form: Form | None, rank: int) -> HalfSpace | None:
    """A select's predicate as an affine_select's: a HalfSpace that varies only along the last two
    of the select's `rank` dimensions (rows and columns of its tiles)."""
    if not isinstance(form, HalfSpace) or form.constant is not None or rank < 2:
        return None
    if any(form.coeffs[:-2]):
        return None
    return form
