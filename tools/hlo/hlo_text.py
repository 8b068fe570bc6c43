"""HLO text (as XLA's `as_hlo_text()` prints it) → an xla.HloModuleProto like XLA serializes.

A hand-written lexer and recursive-descent parser, linear in the length of the text, with bounded
nesting and no backtracking regexes, so that any input — fuzzed garbage included — ends either in a
module or in a CompileError: E103 syntax, E204 a name used but not defined, E205 a dynamic shape,
E206 an element type the schema cannot hold. The module it builds is what XLA would serialize:
callees before callers with the entry last, unique ids, operand/called-computation ids, program
shapes, default layouts, and literals in LiteralProto's typed fields. Semantic checks (operand
counts, shapes, supported opcodes) are the verifier's job, not the parser's.
"""

from __future__ import annotations

import math
import re
from typing import NamedTuple

import numpy as np

from ncc.schemas import hlo_pb2
from ncc.tools.common.dtypes import f32_to_bf16
from ncc.tools.common.errors import CompileError
from ncc.tools.hlo.hlo_types import TYPES_BY_NAME, T, parameters, root_of, same_shape, shape_str, type_name
from ncc.tools.hlo.shape_inference import infer_shape

MAX_NESTING = 32  # tuple shapes / tuple literals nested deeper than this are refused
_MAX_NUMBER_CHARS = 64
_FUSION_KINDS = ("kLoop", "kInput", "kOutput", "kCustom")

# Element types XLA knows but the subset schema has no enum value for (refused with E206).
_UNREPRESENTABLE_TYPES = frozenset({
    "s1", "s2", "s4", "u1", "u2", "u4", "f4e2m1fn", "f8e3m4", "f8e4m3", "f8e4m3fnuz", "f8e4m3b11fnuz",
    "f8e5m2fnuz", "f8e8m0fnu",
})
# Types whose literals the subset LiteralProto cannot hold.
_NO_LITERAL_FIELD = frozenset({T.C64, T.C128, T.F8E5M2, T.F8E4M3FN, T.TOKEN, T.OPAQUE_TYPE})

_INT_RANGES = {
    T.S8: (-(1 << 7), (1 << 7) - 1), T.S16: (-(1 << 15), (1 << 15) - 1),
    T.S32: (-(1 << 31), (1 << 31) - 1), T.S64: (-(1 << 63), (1 << 63) - 1),
    T.U8: (0, (1 << 8) - 1), T.U16: (0, (1 << 16) - 1), T.U32: (0, (1 << 32) - 1), T.U64: (0, (1 << 64) - 1),
}
# A float constant must round to a finite value of its type: its magnitude below the midpoint
# between the largest finite value and the next power of two (JAX prints finfo(f32).min as
# -3.40282347e+38, a little past the largest f32, which rounds to it). A bf16 constant is rounded
# to f32 first, so its bound leaves room for that rounding (an f32 ulp there is 2^104).
_ROUNDS_FINITE_BELOW = {T.F16: 65520.0, T.BF16: 2.0**128 - 2.0**119 - 2.0**104, T.F32: 2.0**128 - 2.0**103,
                        T.F64: math.inf}
_INT64 = _INT_RANGES[T.S64]
_INT32 = _INT_RANGES[T.S32]

_INT_RE = re.compile(r"[-+]?[0-9]+")
_FLOAT_RE = re.compile(r"[-+]?(?:[0-9]+(?:\.[0-9]*)?|\.[0-9]+)(?:[eE][-+]?[0-9]+)?")
_NAME_RE = re.compile(r"[A-Za-z_][A-Za-z0-9_.\-]*")

_WORD_START = frozenset("ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789_.-+%")
# what follows a word's first character: _WORD_START but "%", and no "-" that begins a "->"
_WORD_TAIL = re.compile(r"(?:[A-Za-z0-9_.+]|-(?!>))*")
_PUNCT = frozenset("{}()[],=:?")
_STACK_FRAME_SECTIONS = frozenset({"FileNames", "FunctionNames", "FileLocations", "StackFrames"})
# An array shape written with no spaces, `f32[512,1024]` or `f32[512,1024]{1,0}`, not followed by
# more of a layout: the text the parser reads once and then takes from its cache (a module of
# 12,500 elementwise instructions writes one shape 12,500 times).
_PLAIN_SHAPE_RE = re.compile(r"[a-z][a-z0-9]*\[[0-9,]*\](?:\{[0-9,]*\})?(?![{:A-Za-z0-9_.+\-])")
_OPENERS = {"{": "}", "(": ")", "[": "]"}
_CLOSERS = frozenset(_OPENERS.values())
_VALUE_ENDS = _CLOSERS | {","}
_ESCAPES = {"n": "\n", "t": "\t", "r": "\r", '"': '"', "'": "'", "\\": "\\", "a": "\a", "b": "\b",
            "f": "\f", "v": "\v"}

# Attributes naming called computations, in the order XLA stores them in called_computation_ids.
_CALLED_ATTRS = {"to_apply": 0, "calls": 1, "body": 2, "condition": 3, "true_computation": 4,
                 "false_computation": 5, "branch_computations": 6, "select": 7, "scatter": 8}
# gather's and scatter's dimension-number lists, by the attribute names XLA prints
_GATHER_LISTS = {"offset_dims", "collapsed_slice_dims", "start_index_map", "operand_batching_dims",
                 "start_indices_batching_dims"}
_SCATTER_LISTS = {"update_window_dims", "inserted_window_dims", "scatter_dims_to_operand_dims",
                  "input_batching_dims", "scatter_indices_batching_dims"}
_WINDOW_FIELDS = {"size": "size", "stride": "stride", "lhs_dilate": "base_dilation",
                  "rhs_dilate": "window_dilation", "rhs_reversal": "window_reversal"}
_DOT_ATTRS = {"lhs_contracting_dims": "lhs_contracting_dimensions",
              "rhs_contracting_dims": "rhs_contracting_dimensions",
              "lhs_batch_dims": "lhs_batch_dimensions", "rhs_batch_dims": "rhs_batch_dimensions"}
# rng-bit-generator's `algorithm=` spellings
_RNG_ALGORITHMS = {"rng_default": hlo_pb2.RNG_DEFAULT, "rng_three_fry": hlo_pb2.RNG_THREE_FRY,
                   "rng_philox": hlo_pb2.RNG_PHILOX}


class Token(NamedTuple):
    kind: str  # "w" word, "s" string, "p" punctuation, "eof"
    text: str
    line: int
    col: int
    start: int
    end: int


def _syntax(message: str, line: int, col: int) -> CompileError:
    return CompileError("E103", f"HLO text syntax error: {message} at line {line} col {col}", f"line {line}")


def tokenize(text: str) -> list[Token]:
    """Split HLO text into words, strings and punctuation; comments and whitespace are dropped."""
    tokens: list[Token] = []
    n, i, line, line_start = len(text), 0, 1, 0
    while i < n:
        c = text[i]
        if c == "\n":
            line, line_start, i = line + 1, i + 1, i + 1
            continue
        if c in " \t\r\f\v":
            i += 1
            continue
        col = i - line_start + 1
        if c == "/" and text.startswith("/*", i):
            close = text.find("*/", i + 2)
            if close < 0:
                raise _syntax("unterminated comment", line, col)
            newlines = text.count("\n", i, close)
            if newlines:
                line, line_start = line + newlines, text.rfind("\n", i, close) + 1
            i = close + 2
            continue
        if c == "/" and text.startswith("//", i):
            close = text.find("\n", i)
            i = n if close < 0 else close
            continue
        if c == '"':
            value, j, line_after, line_start_after = _lex_string(text, i, line, line_start)
            tokens.append(Token("s", value, line, col, i, j))
            i, line, line_start = j, line_after, line_start_after
            continue
        if c == "-" and text.startswith("->", i):
            tokens.append(Token("p", "->", line, col, i, i + 2))
            i += 2
            continue
        if c == "<" and text.startswith("<=", i):
            tokens.append(Token("p", "<=", line, col, i, i + 2))
            i += 2
            continue
        if c in _PUNCT:
            tokens.append(Token("p", c, line, col, i, i + 1))
            i += 1
            continue
        if c in _WORD_START:
            j = _WORD_TAIL.match(text, i + 1).end()
            tokens.append(Token("w", text[i:j], line, col, i, j))
            i = j
            continue
        shown = repr(c) if c.isprintable() else f"U+{ord(c):04X}"
        raise _syntax(f"unexpected character {shown}", line, col)
    tokens.append(Token("eof", "", line, n - line_start + 1, n, n))
    return tokens


def _lex_string(text: str, i: int, line: int, line_start: int) -> tuple[str, int, int, int]:
    """Read the string literal starting at text[i] == '"'; returns (value, end, line, line_start)."""
    start_line, start_col = line, i - line_start + 1
    out: list[str] = []
    j, n = i + 1, len(text)
    while j < n:
        c = text[j]
        if c == '"':
            return "".join(out), j + 1, line, line_start
        if c == "\n":
            line, line_start = line + 1, j + 1
        if c != "\\":
            out.append(c)
            j += 1
            continue
        if j + 1 >= n:
            break
        e = text[j + 1]
        if e in _ESCAPES:
            out.append(_ESCAPES[e])
            j += 2
        elif e in "01234567":
            k = j + 1
            while k < n and k < j + 4 and text[k] in "01234567":
                k += 1
            out.append(chr(int(text[j + 1:k], 8)))
            j = k
        elif e == "x" and j + 2 < n and text[j + 2] in "0123456789abcdefABCDEF":
            k = j + 2
            while k < n and k < j + 4 and text[k] in "0123456789abcdefABCDEF":
                k += 1
            out.append(chr(int(text[j + 2:k], 16)))
            j = k
        else:
            out.append(e)
            j += 2
    raise _syntax("unterminated string", start_line, start_col)


class _PendingCall(NamedTuple):
    instr: hlo_pb2.HloInstructionProto
    refs: list[tuple[int, str, Token]]  # (order key, computation name, where it was written)


class _Computation(NamedTuple):
    proto: hlo_pb2.HloComputationProto  # name, root_id, execution_thread; instructions come at the end
    instrs: list[hlo_pb2.HloInstructionProto]  # kept apart: a repeated field would copy them on append
    is_entry: bool
    token: Token


class _Parser:
    """Recursive descent over the token list; every loop consumes a token or raises."""

    def __init__(self, text: str) -> None:
        self.text = text
        self.toks = tokenize(text)
        self.toks += [self.toks[-1]] * 3  # peek() looks up to 2 past the end: it finds the eof there
        self.pos = 0
        self.next_id = 1
        self.calls: list[_PendingCall] = []
        self.shapes: dict[int, hlo_pb2.ShapeProto] = {}  # instruction id -> its shape, for inference
        self.nested: list[hlo_pb2.HloInstructionProto] = []  # nested operands of the instruction being read
        self.nested_count = 0
        self.plain_shapes: dict[str, tuple[hlo_pb2.ShapeProto, int]] = {}  # text -> (shape, tokens read)

    # ---- token helpers -------------------------------------------------------------------------
    def peek(self, ahead: int = 0) -> Token:
        return self.toks[self.pos + ahead]

    def next(self) -> Token:
        tok = self.toks[self.pos]
        if tok.kind != "eof":
            self.pos += 1
        return tok

    def at(self, text: str) -> bool:
        tok = self.peek()
        return tok.kind == "p" and tok.text == text

    def accept(self, text: str) -> bool:
        if self.at(text):
            self.pos += 1
            return True
        return False

    def expect(self, text: str, context: str = "") -> Token:
        tok = self.peek()
        if tok.kind == "p" and tok.text == text:
            self.pos += 1
            return tok
        where = f" {context}" if context else ""
        raise self.error(f"expected '{text}'{where}, found {_describe(tok)}", tok)

    def glued(self) -> bool:
        """Whether the next token follows the previous one with no space in between."""
        return self.pos > 0 and self.peek().start == self.toks[self.pos - 1].end and self.peek().kind != "eof"

    def error(self, message: str, tok: Token | None = None) -> CompileError:
        tok = tok or self.peek()
        return _syntax(message, tok.line, tok.col)

    # ---- small grammar pieces -----------------------------------------------------------------
    def name(self, what: str = "a name") -> str:
        tok = self.peek()
        text = tok.text[1:] if tok.kind == "w" and tok.text.startswith("%") else tok.text
        if tok.kind != "w" or not _NAME_RE.fullmatch(text):
            raise self.error(f"expected {what}, found {_describe(tok)}", tok)
        self.pos += 1
        return text

    def integer(self, lo: int = _INT64[0], hi: int = _INT64[1], what: str = "an integer") -> int:
        tok = self.peek()
        if tok.kind != "w" or len(tok.text) > _MAX_NUMBER_CHARS or not _INT_RE.fullmatch(tok.text):
            raise self.error(f"expected {what}, found {_describe(tok)}", tok)
        value = int(tok.text)
        if not lo <= value <= hi:
            raise self.error(f"{what} {tok.text} is out of range [{lo}, {hi}]", tok)
        self.pos += 1
        return value

    def real(self, what: str) -> float:
        tok = self.peek()
        try:
            value = float(tok.text) if tok.kind == "w" and len(tok.text) <= _MAX_NUMBER_CHARS else None
        except ValueError:
            value = None
        if value is None:
            raise self.error(f"expected {what}, found {_describe(tok)}", tok)
        self.pos += 1
        return value

    def int_list(self) -> list[int]:
        self.expect("{", "to open a list of integers")
        values: list[int] = []
        if self.accept("}"):
            return values
        while True:
            values.append(self.integer())
            if self.accept("}"):
                return values
            self.expect(",", "or '}' in a list of integers")

    def boolean(self) -> bool:
        tok = self.next()
        if tok.kind == "w" and tok.text in ("true", "false"):
            return tok.text == "true"
        raise self.error(f"expected true or false, found {_describe(tok)}", tok)

    def string(self) -> str:
        tok = self.next()
        if tok.kind != "s":
            raise self.error(f"expected a string, found {_describe(tok)}", tok)
        return tok.text

    def word(self, what: str) -> str:
        tok = self.next()
        if tok.kind != "w":
            raise self.error(f"expected {what}, found {_describe(tok)}", tok)
        return tok.text

    def skip_balanced(self) -> None:
        """Skip a bracketed group starting at the next token (an opener), brackets matched."""
        tok = self.next()
        if tok.kind != "p" or tok.text not in _OPENERS:
            raise self.error(f"expected a bracket, found {_describe(tok)}", tok)
        self.skip_to_close([_OPENERS[tok.text]])

    def skip_to_close(self, stack: list[str]) -> None:
        """Skip tokens until the closers on `stack` (innermost last) have all been matched."""
        while stack:
            tok = self.next()
            if tok.kind == "eof":
                raise self.error(f"missing '{stack[-1]}' before the end of the text", tok)
            if tok.kind != "p":
                continue
            if tok.text in _OPENERS:
                stack.append(_OPENERS[tok.text])
            elif tok.text in _CLOSERS:
                if stack[-1] != tok.text:
                    raise self.error(f"expected '{stack[-1]}', found '{tok.text}'", tok)
                stack.pop()

    def skip_atom(self) -> None:
        tok = self.peek()
        if tok.kind == "p" and tok.text in _OPENERS:
            self.skip_balanced()
        elif tok.kind in ("w", "s") or (tok.kind == "p" and tok.text in ("->", "<=", ":", "?")):
            self.pos += 1
        else:
            raise self.error(f"expected an attribute value, found {_describe(tok)}", tok)

    def skip_value(self) -> None:
        """Skip an attribute value we do not interpret: atoms written without spaces between them."""
        self.skip_atom()
        while self.glued() and not (self.peek().kind == "p" and self.peek().text in _VALUE_ENDS):
            self.skip_atom()

    # ---- shapes --------------------------------------------------------------------------------
    def shape(self, depth: int = 0) -> hlo_pb2.ShapeProto:
        """The shape written next. The proto returned may be shared: callers copy it."""
        tok = self.peek()
        plain = _PLAIN_SHAPE_RE.match(self.text, tok.start) if tok.kind == "w" else None
        if plain is None:
            return self.parse_shape(depth)
        known = self.plain_shapes.get(plain.group())
        if known is not None:
            self.pos += known[1]
            return known[0]
        start = self.pos
        shape = self.parse_shape(depth)
        if self.toks[self.pos - 1].end == plain.end():
            self.plain_shapes[plain.group()] = (shape, self.pos - start)
        return shape

    def parse_shape(self, depth: int = 0) -> hlo_pb2.ShapeProto:
        if depth > MAX_NESTING:
            raise self.error("shape nesting is too deep")
        shape = hlo_pb2.ShapeProto()
        tok = self.peek()
        if self.accept("("):
            shape.element_type = T.TUPLE
            if self.accept(")"):
                return shape
            while True:
                shape.tuple_shapes.append(self.shape(depth + 1))
                if self.accept(")"):
                    return shape
                self.expect(",", "or ')' in a tuple shape")
        if tok.kind != "w":
            raise self.error(f"expected a shape, found {_describe(tok)}", tok)
        kind = TYPES_BY_NAME.get(tok.text)
        if kind is None:
            if tok.text in _UNREPRESENTABLE_TYPES:
                raise CompileError("E206", f"element type '{tok.text}' is not supported (line {tok.line} col "
                                           f"{tok.col})", f"line {tok.line}")
            raise self.error(f"expected a shape, found {_describe(tok)}", tok)
        self.pos += 1
        shape.element_type = kind
        self.expect("[", f"after element type '{tok.text}'")
        if not self.accept("]"):
            while True:
                dim = self.peek()
                if dim.kind == "p" and dim.text in ("<=", "?"):
                    raise CompileError("E205", f"dynamic dimension '{dim.text}' in a shape is not supported "
                                               f"(line {dim.line} col {dim.col})", f"line {dim.line}")
                shape.dimensions.append(self.integer(0, _INT64[1], "a dimension size"))
                if self.accept("]"):
                    break
                self.expect(",", "or ']' in a shape's dimensions")
        if kind in (T.TOKEN, T.OPAQUE_TYPE):
            return shape
        shape.is_dynamic_dimension.extend([False] * len(shape.dimensions))
        if self.glued() and self.at("{"):
            self.layout(shape)
        else:
            shape.layout.minor_to_major.extend(range(len(shape.dimensions) - 1, -1, -1))
        return shape

    def layout(self, shape: hlo_pb2.ShapeProto) -> None:
        """`{1,0}` or `{1,0:T(8,128)}`: minor_to_major, then tiling/memory-space details we skip."""
        self.expect("{")
        shape.layout.SetInParent()
        if self.accept("}"):
            return
        while True:
            if self.accept(":"):
                self.skip_to_close(["}"])
                return
            shape.layout.minor_to_major.append(self.integer(0, _INT64[1], "a layout dimension"))
            if self.accept("}"):
                return
            if not self.at(":"):
                self.expect(",", "or '}' in a layout")

    # ---- literals ------------------------------------------------------------------------------
    def literal(self, shape: hlo_pb2.ShapeProto, where: str, depth: int = 0) -> hlo_pb2.LiteralProto:
        if depth > MAX_NESTING:
            raise self.error("literal nesting is too deep")
        literal = hlo_pb2.LiteralProto()
        literal.shape.CopyFrom(shape)
        if shape.element_type == T.TUPLE:
            self.expect("(", "to open a tuple literal")
            for index, sub in enumerate(shape.tuple_shapes):
                if index:
                    self.expect(",", "between tuple literal elements")
                literal.tuple_literals.append(self.literal(sub, where, depth + 1))
            self.expect(")", "to close a tuple literal")
            return literal
        if shape.element_type in _NO_LITERAL_FIELD:
            kind = type_name(shape.element_type)
            raise CompileError("E206", f"constant '{where}' of element type {kind} is not supported", where)
        if shape.dimensions:
            values = self.array_values(list(shape.dimensions))
        else:
            values = [self.scalar_token()]
        _fill_literal(literal, shape.element_type, values)
        return literal

    def array_values(self, sizes: list[int]) -> list[Token]:
        """Nested `{...}` of a rank ≥ 1 literal, checked against `sizes`, flattened row-major."""
        kind_values: list[Token] = []
        rank = len(sizes)
        self.expect("{", "to open an array constant")
        counts = [0]
        need_separator = False
        while True:
            tok = self.peek()
            if self.accept("}"):
                depth = len(counts)
                if counts[-1] != sizes[depth - 1]:
                    raise self.error(f"constant has {counts[-1]} elements in dimension {depth - 1}, "
                                     f"its shape says {sizes[depth - 1]}", tok)
                counts.pop()
                if not counts:
                    return kind_values
                counts[-1] += 1
                need_separator = True
                continue
            if need_separator:
                self.expect(",", "or '}' between constant elements")
                need_separator = False
                continue
            if tok.kind == "w" and tok.text == "...":
                raise self.error("constant values are elided ('{...}'); print the module with its large "
                                 "constants", tok)
            if len(counts) < rank:
                self.expect("{", f"to open dimension {len(counts)} of an array constant")
                counts.append(0)
                continue
            kind_values.append(self.scalar_token())
            counts[-1] += 1
            need_separator = True

    def scalar_token(self) -> Token:
        tok = self.peek()
        if tok.kind != "w":
            raise self.error(f"expected a constant value, found {_describe(tok)}", tok)
        self.pos += 1
        if tok.text.lstrip("+-") == "nan" and self.glued() and self.at("("):
            self.skip_balanced()  # a NaN payload such as nan(0x7fc00001)
        return tok

    # ---- instructions and computations --------------------------------------------------------
    def instruction(self, comp_name: str, names: dict[str, int], control: list) -> tuple[
            hlo_pb2.HloInstructionProto, bool]:
        is_root = False
        if self.peek().kind == "w" and self.peek().text == "ROOT" and self.peek(1).kind == "w":
            self.pos += 1
            is_root = True
        name_tok = self.peek()
        name = self.name("an instruction name")
        if name in names:
            raise self.error(f"instruction '{name}' is defined twice in computation '{comp_name}'", name_tok)
        self.expect("=", f"after instruction name '{name}'")
        instr = self.instruction_rhs(name, comp_name, names, control)
        names[name] = instr.id
        return instr, is_root

    def at_shape(self) -> bool:
        tok = self.peek()
        if tok.kind == "p" and tok.text == "(":
            return True
        return tok.kind == "w" and self.peek(1).kind == "p" and self.peek(1).text == "[" and (
            tok.text in TYPES_BY_NAME or tok.text in _UNREPRESENTABLE_TYPES)

    def instruction_rhs(self, name: str, comp_name: str, names: dict[str, int], control: list,
                        nested: bool = False) -> hlo_pb2.HloInstructionProto:
        """`[shape] opcode(operands), attributes` — the shape may be left out where it can be inferred."""
        instr = hlo_pb2.HloInstructionProto(name=name)
        shape_given = self.at_shape()
        if shape_given:
            instr.shape.CopyFrom(self.shape())
        opcode_tok = self.peek()
        instr.opcode = self.word("an opcode")
        if not _NAME_RE.fullmatch(instr.opcode):
            raise self.error(f"expected an opcode, found {_describe(opcode_tok)}", opcode_tok)
        if not shape_given and instr.opcode in ("constant", "parameter"):
            raise self.error(f"{instr.opcode} '{name}' must give its shape", opcode_tok)
        self.expect("(", f"after opcode '{instr.opcode}'")
        if instr.opcode == "constant":
            instr.literal.CopyFrom(self.literal(instr.shape, name))
            self.expect(")", "to close a constant")
        elif instr.opcode == "parameter":
            instr.parameter_number = self.integer(0, _INT64[1], "a parameter number")
            self.expect(")", "to close a parameter")
        elif not self.accept(")"):
            while True:
                self.operand(instr, names, comp_name)
                if self.accept(")"):
                    break
                self.expect(",", "or ')' between operands")
        seen: set[str] = set()
        calls: list[tuple[int, str, Token]] = []
        while self.at(",") and (not nested or (self.peek(1).kind == "w" and self.peek(2).text == "=")):
            self.pos += 1
            self.attribute(instr, seen, calls, control)
        if calls:
            calls.sort(key=lambda ref: ref[0])
            self.calls.append(_PendingCall(instr, calls))
        if not shape_given:
            inferred = infer_shape(instr, [self.shapes[i] for i in instr.operand_ids])
            if inferred is None:
                raise self.error(f"instruction '{name}' gives no result shape, and the shape of "
                                 f"'{instr.opcode}' cannot be inferred from its operands", opcode_tok)
            instr.shape.CopyFrom(inferred)
        instr.id = self.next_id
        self.next_id += 1
        self.shapes[instr.id] = instr.shape
        return instr

    def operand(self, instr: hlo_pb2.HloInstructionProto, names: dict[str, int], comp_name: str) -> None:
        start = self.pos
        if self.at_shape():
            self.shape()
        if self.peek().kind == "w" and self.peek(1).kind == "p" and self.peek(1).text == "(":
            # a nested instruction, `add(f32[3] reshape(x), y)`: defined just before its user
            self.pos = start
            self.nested_count += 1
            label = f"{instr.name}.{self.nested_count}"
            nested = self.instruction_rhs(label, comp_name, names, [], nested=True)
            self.nested.append(nested)
            names[nested.name] = nested.id
            instr.operand_ids.append(nested.id)
            return
        ref = self.peek()
        name = self.name("an operand name")
        if name not in names:
            where = f"line {ref.line} col {ref.col}"
            raise CompileError("E204", f"instruction '{instr.name}' uses '{name}', which is not defined "
                                       f"before it in computation '{comp_name}' ({where})", instr.name)
        instr.operand_ids.append(names[name])

    def attribute(self, instr: hlo_pb2.HloInstructionProto, seen: set[str],
                  calls: list[tuple[int, str, Token]], control: list) -> None:
        key_tok = self.peek()
        key = self.word("an attribute name")
        self.expect("=", f"after attribute '{key}'")
        slot = "dimensions" if key == "iota_dimension" else key
        if slot in seen:
            raise self.error(f"attribute '{key}' is given twice", key_tok)
        seen.add(slot)
        if key == "dimensions":
            instr.dimensions.extend(self.int_list())
        elif key == "iota_dimension":
            instr.dimensions.append(self.integer())
        elif key == "index":
            instr.tuple_index = self.integer()
        elif key in _DOT_ATTRS:
            getattr(instr.dot_dimension_numbers, _DOT_ATTRS[key]).extend(self.int_list())
        elif key == "direction":
            instr.comparison_direction = self.word("a comparison direction")
        elif key == "type":
            instr.comparison_type = self.word("a comparison type")
        elif key == "slice":
            self.slice_dims(instr)
        elif key == "padding":
            self.padding(instr)
        elif key in _CALLED_ATTRS:
            order = _CALLED_ATTRS[key]
            if self.at("{"):
                self.pos += 1
                while not self.accept("}"):
                    tok = self.peek()
                    calls.append((order, self.name("a computation name"), tok))
                    if not self.at("}"):
                        self.expect(",", "or '}' in a list of computations")
            else:
                tok = self.peek()
                calls.append((order, self.name("a computation name"), tok))
        elif key == "metadata":
            self.metadata(instr.metadata)
        elif key == "frontend_attributes":
            self.frontend_attributes(instr.frontend_attributes)
        elif key in ("exponent_bits", "mantissa_bits"):
            setattr(instr, key, self.integer(*_INT32))
        elif key == "feature_index":
            instr.feature_index = self.integer(0, _INT64[1], "a feature_index")
        elif key == "epsilon":
            instr.epsilon = self.real("an epsilon")
        elif key in ("is_stable", "largest"):
            setattr(instr, key, self.boolean())
        elif key == "custom_call_target":
            instr.custom_call_target = self.string().encode("utf-8")
        elif key == "backend_config" and self.peek().kind == "s":
            instr.backend_config = self.string().encode("utf-8")
        elif key == "kind":
            tok = self.peek()
            instr.fusion_kind = self.word("a fusion kind")
            if instr.fusion_kind not in _FUSION_KINDS:
                kinds = ", ".join(_FUSION_KINDS)
                raise self.error(f"unknown fusion kind {instr.fusion_kind} (XLA's: {kinds})", tok)
        elif key == "dynamic_slice_sizes":
            instr.dynamic_slice_sizes.extend(self.int_list())
        elif key == "slice_sizes":
            instr.gather_slice_sizes.extend(self.int_list())
        elif key == "window":
            self.window(instr.window)
        elif key == "dim_labels":
            self.dim_labels(instr.convolution_dimension_numbers)
        elif key in ("feature_group_count", "batch_group_count"):
            setattr(instr, key, self.integer(1, _INT64[1], f"a {key}"))
        elif key in _GATHER_LISTS:
            getattr(instr.gather_dimension_numbers, key).extend(self.int_list())
        elif key in _SCATTER_LISTS:
            getattr(instr.scatter_dimension_numbers, key).extend(self.int_list())
        elif key == "index_vector_dim":
            scatter = instr.opcode == "scatter"
            numbers = instr.scatter_dimension_numbers if scatter else instr.gather_dimension_numbers
            numbers.index_vector_dim = self.integer(0, _INT64[1], "an index_vector_dim")
        elif key == "k":
            instr.k = self.integer(0, _INT64[1], "a k")
        elif key in ("indices_are_sorted", "unique_indices"):
            setattr(instr, key, self.boolean())
        elif key == "algorithm" and instr.opcode == "rng-bit-generator":  # dot's algorithm= is skipped
            tok = self.peek()
            word = self.word("a random algorithm")
            if word not in _RNG_ALGORITHMS:
                raise self.error(f"unknown algorithm '{word}' (expected one of "
                                 f"{', '.join(_RNG_ALGORITHMS)})", tok)
            instr.rng_algorithm = _RNG_ALGORITHMS[word]
        elif key == "control-predecessors":
            self.expect("{", "to open a list of control predecessors")
            while not self.accept("}"):
                tok = self.peek()
                control.append((instr, self.name("an instruction name"), tok))
                if not self.at("}"):
                    self.expect(",", "or '}' in a list of control predecessors")
        else:
            self.skip_value()

    def window(self, window: hlo_pb2.Window) -> None:
        """`{size=3x3 stride=2x1 pad=1_1x0_0 lhs_dilate=1x1 rhs_dilate=2x2 rhs_reversal=0x1}`."""
        self.expect("{", "to open a window")
        window.SetInParent()
        fields: dict[str, list[int]] = {}
        while not self.accept("}"):
            tok = self.peek()
            key = self.word("a window field")
            self.expect("=", f"after window field '{key}'")
            text = self.word(f"the values of window field '{key}'")
            parts = text.split("x")
            if key == "pad":
                pairs = [part.split("_") for part in parts]
                if not all(len(pair) == 2 and all(_INT_RE.fullmatch(v) for v in pair) for pair in pairs):
                    raise self.error(f"malformed window padding '{text}'", tok)
                fields["padding_low"] = [int(pair[0]) for pair in pairs]
                fields["padding_high"] = [int(pair[1]) for pair in pairs]
            elif key in _WINDOW_FIELDS:
                if not all(_INT_RE.fullmatch(part) for part in parts):
                    raise self.error(f"malformed window {key} '{text}'", tok)
                fields[_WINDOW_FIELDS[key]] = [int(part) for part in parts]
            else:
                raise self.error(f"unknown window field '{key}'", tok)
        rank = len(fields.get("size", []))
        if any(len(values) != rank for values in fields.values()):
            raise self.error("window fields give different numbers of dimensions")
        for d in range(rank):
            dim = window.dimensions.add(stride=1, window_dilation=1, base_dilation=1)
            for name, values in fields.items():
                setattr(dim, name, bool(values[d]) if name == "window_reversal" else values[d])

    def dim_labels(self, numbers: hlo_pb2.ConvolutionDimensionNumbers) -> None:
        """`b01f_01io->b01f`: which dimension of input, kernel and output is batch, feature, spatial."""
        tok = self.peek()
        first = self.word("convolution dimension labels")
        self.expect("->", "in convolution dimension labels")
        output = self.word("output dimension labels")
        parts = first.split("_")
        if len(parts) != 2:
            raise self.error(f"malformed dim_labels '{first}->{output}'", tok)
        lhs, rhs = parts
        numbers.SetInParent()
        try:
            numbers.input_batch_dimension, numbers.input_feature_dimension = lhs.index("b"), lhs.index("f")
            numbers.kernel_input_feature_dimension = rhs.index("i")
            numbers.kernel_output_feature_dimension = rhs.index("o")
            numbers.output_batch_dimension = output.index("b")
            numbers.output_feature_dimension = output.index("f")
        except ValueError:
            raise self.error(f"malformed dim_labels '{first}->{output}'", tok) from None
        spatials = ((lhs, numbers.input_spatial_dimensions), (rhs, numbers.kernel_spatial_dimensions),
                    (output, numbers.output_spatial_dimensions))
        for labels, field in spatials:
            spatial = sorted((c, i) for i, c in enumerate(labels) if c.isdigit())
            field.extend(i for _, i in spatial)

    def slice_dims(self, instr: hlo_pb2.HloInstructionProto) -> None:
        self.expect("{", "to open slice bounds")
        if self.accept("}"):
            return
        while True:
            self.expect("[", "to open a slice bound [start:limit:stride]")
            start = self.integer()
            self.expect(":", "in a slice bound")
            limit = self.integer()
            stride = 1
            if self.accept(":"):
                stride = self.integer()
            self.expect("]", "to close a slice bound")
            instr.slice_dimensions.add(start=start, limit=limit, stride=stride)
            if self.accept("}"):
                return
            self.expect(",", "or '}' between slice bounds")

    def padding(self, instr: hlo_pb2.HloInstructionProto) -> None:
        tok = self.peek()
        text = self.word("a padding such as 0_0x1_1")
        instr.padding_config.SetInParent()
        for part in text.split("x"):
            numbers = part.split("_")
            if len(numbers) not in (2, 3) or not all(
                    len(v) <= _MAX_NUMBER_CHARS and _INT_RE.fullmatch(v) for v in numbers):
                raise self.error(f"malformed padding '{text}'", tok)
            values = [int(v) for v in numbers] + [0] * (3 - len(numbers))
            if not all(_INT64[0] <= v <= _INT64[1] for v in values):
                raise self.error(f"padding '{text}' is out of range", tok)
            instr.padding_config.dimensions.add(edge_padding_low=values[0], edge_padding_high=values[1],
                                                interior_padding=values[2])

    def metadata(self, metadata: hlo_pb2.OpMetadata) -> None:
        self.expect("{", "to open metadata")
        metadata.SetInParent()
        while not self.accept("}"):
            key = self.word("a metadata field")
            self.expect("=", f"after metadata field '{key}'")
            if key in ("op_type", "op_name", "source_file"):
                setattr(metadata, key, self.string())
            elif key == "source_line":
                metadata.source_line = self.integer(*_INT32)
            else:
                self.skip_value()
            self.accept(",")

    def frontend_attributes(self, attrs: hlo_pb2.FrontendAttributes) -> None:
        self.expect("{", "to open frontend attributes")
        attrs.SetInParent()
        while not self.accept("}"):
            key_tok = self.next()
            if key_tok.kind not in ("w", "s"):
                raise self.error(f"expected an attribute name, found {_describe(key_tok)}", key_tok)
            self.expect("=", f"after frontend attribute '{key_tok.text}'")
            value = self.next()
            if value.kind not in ("w", "s"):
                raise self.error(f"expected an attribute value, found {_describe(value)}", value)
            attrs.map[key_tok.text] = value.text
            if not self.at("}"):
                self.expect(",", "or '}' between frontend attributes")

    def computation_attributes(self, comp: hlo_pb2.HloComputationProto) -> None:
        """`, key=value` pairs of a computation: its execution_thread kept, the others skipped."""
        while self.accept(","):
            key = self.word("an attribute name")
            self.expect("=", f"after attribute '{key}'")
            if key == "execution_thread" and self.peek().kind == "s":
                comp.execution_thread = self.string()
            else:
                self.skip_value()

    def computation(self) -> _Computation:
        is_entry = False
        if self.peek().kind == "w" and self.peek().text == "ENTRY" and self.peek(1).kind == "w":
            self.pos += 1
            is_entry = True
        name_tok = self.peek()
        comp = hlo_pb2.HloComputationProto(name=self.name("a computation name"))
        declared = None
        if self.at("("):
            self.skip_balanced()
            self.expect("->", "after a computation's parameter list")
            declared = self.shape()
        self.computation_attributes(comp)
        self.expect("{", f"to open computation '{comp.name}'")
        names: dict[str, int] = {}
        control: list[tuple[hlo_pb2.HloInstructionProto, str, Token]] = []
        root_id = None
        instrs: list[hlo_pb2.HloInstructionProto] = []
        while not self.accept("}"):
            if self.peek().kind == "eof":
                raise self.error(f"missing '}}' at the end of computation '{comp.name}'")
            root_tok = self.peek()
            instr, is_root = self.instruction(comp.name, names, control)
            instrs.extend(self.nested)
            self.nested.clear()
            if is_root:
                if root_id is not None:
                    raise self.error(f"computation '{comp.name}' has more than one ROOT", root_tok)
                root_id = instr.id
            instrs.append(instr)
        self.computation_attributes(comp)  # XLA prints `}, execution_thread="..."` after the body
        if not instrs:
            raise self.error(f"computation '{comp.name}' has no instructions", name_tok)
        comp.root_id = instrs[-1].id if root_id is None else root_id
        root = next(instr for instr in instrs if instr.id == comp.root_id)
        if declared is not None and not same_shape(declared, root.shape):
            raise CompileError("E203", f"computation '{comp.name}' declares that it returns "
                                       f"{shape_str(declared)}, but its root '{root.name}' is "
                                       f"{shape_str(root.shape)} (line {name_tok.line})", comp.name)
        for instr, pred, tok in control:
            if pred not in names:
                raise CompileError("E204", f"instruction '{instr.name}' names control predecessor '{pred}', "
                                           f"which is not in computation '{comp.name}' (line {tok.line} col "
                                           f"{tok.col})", instr.name)
            instr.control_predecessor_ids.append(names[pred])
        return _Computation(comp, instrs, is_entry, name_tok)

    # ---- the module ----------------------------------------------------------------------------
    def at_section(self) -> bool:
        """At one of the stack-frame sections, its name followed by an entry or another section."""
        name, after = self.peek(), self.peek(1)
        return name.kind == "w" and name.text in _STACK_FRAME_SECTIONS and after.kind == "w" and (
            bool(_INT_RE.fullmatch(after.text)) or after.text in _STACK_FRAME_SECTIONS)

    def skip_stack_frame_sections(self) -> None:
        """Skip what XLA prints between the module's header and its computations when it keeps
        source locations (JAX's `.compile().as_text()`): `FileNames`, `FunctionNames`,
        `FileLocations` and `StackFrames`, each a list of `N "string"` or `N {key=value ...}`.
        Instructions point into them with `stack_frame_id`, which metadata skips as well."""
        while self.at_section():
            self.pos += 1
            while self.peek().kind == "w" and _INT_RE.fullmatch(self.peek().text) and (
                    self.peek(1).kind == "s" or (self.peek(1).kind == "p" and self.peek(1).text == "{")):
                self.pos += 1
                self.skip_atom()

    def module(self) -> hlo_pb2.HloModuleProto:
        module = hlo_pb2.HloModuleProto(name="module")
        if self.peek().kind == "w" and self.peek().text == "HloModule":
            self.pos += 1
            tok = self.peek()
            if tok.kind != "w":
                raise self.error(f"expected a module name, found {_describe(tok)}", tok)
            module.name = self.next().text.lstrip("%") or "module"
            self.accept(":")  # `HloModule name:` is accepted by XLA's parser too
            while self.accept(","):
                key = self.word("an attribute name")
                self.expect("=", f"after attribute '{key}'")
                if key == "frontend_attributes":
                    self.frontend_attributes(module.frontend_attributes)
                else:
                    self.skip_value()
        self.skip_stack_frame_sections()
        comps: list[_Computation] = []
        while self.peek().kind != "eof":
            comps.append(self.computation())
        if not comps:
            raise self.error("expected a computation")
        _link(module, comps, self.calls)
        return module


def _describe(tok: Token) -> str:
    if tok.kind == "eof":
        return "the end of the text"
    text = tok.text if len(tok.text) <= 40 else tok.text[:37] + "..."
    return f'string "{text}"' if tok.kind == "s" else f"'{text}'"


def _scalar_value(tok: Token, kind: int) -> object:
    """The Python value of one constant element written as `tok`, checked against `kind`."""
    text = tok.text
    if len(text) > _MAX_NUMBER_CHARS:
        raise _syntax(f"constant value '{text[:20]}...' is too long", tok.line, tok.col)
    if kind == T.PRED:
        if text in ("true", "1"):
            return True
        if text in ("false", "0"):
            return False
        raise _syntax(f"expected true or false for a pred constant, found '{text}'", tok.line, tok.col)
    if kind in _INT_RANGES:
        if not _INT_RE.fullmatch(text):
            raise _syntax(f"expected an integer for a {type_name(kind)} constant, found '{text}'",
                          tok.line, tok.col)
        value = int(text)
        lo, hi = _INT_RANGES[kind]
        if not lo <= value <= hi:
            raise _syntax(f"constant {text} is out of range for {type_name(kind)}", tok.line, tok.col)
        return value
    bare = text.lstrip("+-")
    if bare in ("inf", "nan") and len(text) - len(bare) <= 1:
        value = math.inf if bare == "inf" else math.nan
        return -value if text.startswith("-") else value
    if not _FLOAT_RE.fullmatch(text):
        raise _syntax(f"expected a number for a {type_name(kind)} constant, found '{text}'",
                      tok.line, tok.col)
    value = float(text)
    if not abs(value) < _ROUNDS_FINITE_BELOW[kind]:
        raise _syntax(f"constant {text} is out of range for {type_name(kind)}", tok.line, tok.col)
    return value


def _fill_literal(literal: hlo_pb2.LiteralProto, kind: int, tokens: list[Token]) -> None:
    """Store constant elements in the LiteralProto field XLA uses for `kind`."""
    values = [_scalar_value(tok, kind) for tok in tokens]
    with np.errstate(all="ignore"):
        if kind == T.PRED:
            literal.preds.extend(values)
        elif kind in (T.S32, T.S64, T.U32, T.U64):
            field = {T.S32: literal.s32s, T.S64: literal.s64s, T.U32: literal.u32s, T.U64: literal.u64s}[kind]
            field.extend(values)
        elif kind in (T.S8, T.U8, T.S16, T.U16):
            storage = {T.S8: "i1", T.U8: "u1", T.S16: "<i2", T.U16: "<u2"}[kind]
            data = np.array(values, dtype=np.int64).astype(storage).tobytes()
            name = {T.S8: "s8s", T.U8: "u8s", T.S16: "s16s", T.U16: "u16s"}[kind]
            setattr(literal, name, data)
        elif kind == T.F32:
            literal.f32s.extend(np.array(values, dtype=np.float64).astype(np.float32).tolist())
        elif kind == T.F64:
            literal.f64s.extend(values)
        elif kind == T.F16:
            literal.f16s = np.array(values, dtype=np.float64).astype("<f2").tobytes()
        elif kind == T.BF16:
            words = f32_to_bf16(np.array(values, dtype=np.float64).astype(np.float32))
            literal.bf16s = words.astype("<u2").tobytes()


def _link(module: hlo_pb2.HloModuleProto, comps: list[_Computation], calls: list[_PendingCall]) -> None:
    """Resolve computation names, order callees before callers with the entry last, fill ids and shapes."""
    by_name: dict[str, int] = {}
    for index, comp in enumerate(comps):
        if comp.proto.name in by_name:
            tok = comp.token
            raise _syntax(f"computation '{comp.proto.name}' is defined twice", tok.line, tok.col)
        by_name[comp.proto.name] = index
    entries = [index for index, comp in enumerate(comps) if comp.is_entry]
    if len(entries) > 1:
        tok = comps[entries[1]].token
        raise _syntax("more than one ENTRY computation", tok.line, tok.col)
    entry = entries[0] if entries else len(comps) - 1

    owner: dict[int, int] = {}
    for index, comp in enumerate(comps):
        for instr in comp.instrs:
            owner[instr.id] = index
    callees: list[list[int]] = [[] for _ in comps]
    for call in calls:
        for _, name, tok in call.refs:
            if name not in by_name:
                where = f"line {tok.line} col {tok.col}"
                raise CompileError("E204", f"instruction '{call.instr.name}' calls computation '{name}', "
                                           f"which is not defined ({where})", call.instr.name)
            if by_name[name] == entry:
                raise CompileError("E204", f"instruction '{call.instr.name}' calls the entry computation "
                                           f"'{name}'", call.instr.name)
            callees[owner[call.instr.id]].append(by_name[name])

    order = _callees_first(comps, callees, entry)
    position = {comp_index: pos for pos, comp_index in enumerate(order)}
    for call in calls:
        call.instr.called_computation_ids.extend(position[by_name[name]] + 1 for _, name, _ in call.refs)
    for pos, comp_index in enumerate(order):
        proto = comps[comp_index].proto
        proto.instructions.extend(comps[comp_index].instrs)
        proto.id = pos + 1
        _program_shape(proto)
        module.computations.append(proto)
    entry_proto = module.computations[-1]
    module.entry_computation_name = entry_proto.name
    module.entry_computation_id = entry_proto.id
    module.host_program_shape.CopyFrom(entry_proto.program_shape)
    del module.host_program_shape.parameter_names[:]
    module.host_program_shape.parameter_names.extend(
        f"p{i}" for i in range(len(entry_proto.program_shape.parameters)))


def _callees_first(comps: list[_Computation], callees: list[list[int]], entry: int) -> list[int]:
    """Post-order of the call graph (iterative DFS, text order among equals), entry last; cycles → E204."""
    state = [0] * len(comps)  # 0 new, 1 on the stack, 2 done
    order: list[int] = []
    roots = [i for i in range(len(comps)) if i != entry] + [entry]
    for root in roots:
        if state[root]:
            continue
        stack = [(root, 0)]
        state[root] = 1
        while stack:
            node, child = stack[-1]
            if child < len(callees[node]):
                stack[-1] = (node, child + 1)
                callee = callees[node][child]
                if state[callee] == 1:
                    name = comps[callee].proto.name
                    raise CompileError("E204", f"computation '{name}' calls itself (recursion is not "
                                               "supported)", name)
                if state[callee] == 0:
                    state[callee] = 1
                    stack.append((callee, 0))
                continue
            stack.pop()
            state[node] = 2
            order.append(node)
    return order


def _program_shape(comp: hlo_pb2.HloComputationProto) -> None:
    for param in parameters(comp):
        comp.program_shape.parameters.append(param.shape)
        comp.program_shape.parameter_names.append(param.name)
    root = root_of(comp)
    if root is not None:
        comp.program_shape.result.CopyFrom(root.shape)


def parse_hlo_text(text: str) -> hlo_pb2.HloModuleProto:
    """Parse HLO text into an HloModuleProto; any problem is a CompileError (E103/E204/E205/E206)."""
    try:
        text.encode("utf-8")
    except UnicodeEncodeError as err:
        raise CompileError("E103", f"HLO text syntax error: invalid character at offset {err.start}",
                           f"offset {err.start}") from None
    try:
        return _Parser(text).module()
    except CompileError:
        raise
    except RecursionError:
        raise CompileError("E103", "HLO text syntax error: nesting is too deep") from None
    except (ValueError, TypeError, OverflowError, IndexError, KeyError) as err:  # a bug: still no traceback
        raise CompileError("E103", f"HLO text could not be parsed (internal parser error: {err!r})") from None
