"""Building new HLO instructions inside a module being rewritten (expand.py's composite ops,
transpose_folding.py's dots): fresh ids and names, constants, elementwise ops and sums,
appended in order to the instruction list being written."""

from __future__ import annotations

from ncc.schemas import hlo_pb2
from ncc.tools.hlo.hlo_types import T, dims
from ncc.tools.hlo.shape_inference import array_shape

Instr = hlo_pb2.HloInstructionProto
Shape = hlo_pb2.ShapeProto


class HloEditor:
    """New instructions for `module`: each `emit` appends to `out` (the computation's instructions
    being rewritten) an instruction named after `base` with an id no other instruction has."""

    def __init__(self, module: hlo_pb2.HloModuleProto) -> None:
        self.module = module
        self.next_id = 1 + max((i.id for c in module.computations for i in c.instructions), default=0)
        self.next_computation = 1 + max((c.id for c in module.computations), default=0)
        self.names = {i.name for c in module.computations for i in c.instructions}
        self.adders: dict[int, int] = {}  # element type -> id of a scalar add computation
        self.out: list[Instr] = []
        self.base = ""

    def emit(self, opcode: str, shape: Shape, operands: list[Instr], **fields) -> Instr:
        name = f"{self.base}.{opcode}"
        k = 1
        while f"{name}.{k}" in self.names:
            k += 1
        self.names.add(f"{name}.{k}")
        instr = Instr(name=f"{name}.{k}", opcode=opcode, shape=shape, id=self.next_id,
                      operand_ids=[o.id for o in operands], **fields)
        self.next_id += 1
        self.out.append(instr)
        return instr

    def constant(self, value: float, kind: int, shape: tuple[int, ...] | list[int] = ()) -> Instr:
        """`value` of type `kind` over `shape`: an f32 or u32 scalar constant, converted, broadcast."""
        source = T.U32 if kind == T.U32 else T.F32
        literal = hlo_pb2.LiteralProto(shape=array_shape(source, []))
        (literal.u32s if source == T.U32 else literal.f32s).append(int(value) if source == T.U32 else value)
        scalar = self.emit("constant", array_shape(source, []), [], literal=literal)
        if kind != source:
            scalar = self.emit("convert", array_shape(kind, []), [scalar])
        return self.array("broadcast", kind, shape, [scalar]) if shape else scalar

    def binary(self, opcode: str, a: Instr, b: Instr, **fields) -> Instr:
        kind = T.PRED if opcode == "compare" else a.shape.element_type
        return self.array(opcode, kind, dims(a.shape), [a, b], **fields)

    def unary(self, opcode: str, a: Instr, kind: int | None = None) -> Instr:
        return self.array(opcode, a.shape.element_type if kind is None else kind, dims(a.shape), [a])

    def array(self, opcode: str, kind: int, sizes: list[int] | tuple[int, ...], operands: list[Instr],
              **fields) -> Instr:
        """`emit` of an array result of element type `kind` and `sizes`."""
        return self.emit(opcode, array_shape(kind, sizes), operands, **fields)

    def select(self, pred: Instr, on_true: Instr, on_false: Instr) -> Instr:
        return self.emit("select", on_true.shape, [pred, on_true, on_false])

    def sum_over(self, x: Instr, axes: list[int]) -> Instr:
        kind = x.shape.element_type
        kept = [size for d, size in enumerate(dims(x.shape)) if d not in axes]
        return self.array("reduce", kind, kept, [x, self.constant(0.0, kind)], dimensions=axes,
                          called_computation_ids=[self._adder(kind)])

    def _adder(self, kind: int) -> int:
        """A computation adding two scalars of `kind`, made once per type."""
        if kind not in self.adders:
            scalar = array_shape(kind, [])
            ids = [self.next_id, self.next_id + 1, self.next_id + 2]
            self.next_id += 3
            params = [Instr(name=f"add.{kind}.expand.p{n}", opcode="parameter", shape=scalar, id=ids[n],
                            parameter_number=n) for n in (0, 1)]
            root = Instr(name=f"add.{kind}.expand.sum", opcode="add", shape=scalar, id=ids[2],
                         operand_ids=ids[:2])
            comp = hlo_pb2.HloComputationProto(
                name=f"add.{kind}.expand", id=self.next_computation, root_id=ids[2],
                instructions=[*params, root],
                program_shape=hlo_pb2.ProgramShapeProto(parameters=[scalar, scalar], result=scalar))
            self.next_computation += 1
            self.module.computations.insert(0, comp)  # callees before their callers
            self.adders[kind] = comp.id
        return self.adders[kind]
