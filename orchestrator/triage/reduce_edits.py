"""The edits `ncc reduce` tries on an HLO module, each giving a smaller module (a candidate).

Four kinds, each a list of targets the reducer cuts into chunks (delta debugging) or tries one
at a time, in this order:

    instructions  (chunked) remove instructions: in the entry computation each becomes a
                  parameter of its shape for the instructions that used it (a tuple of
                  parameters for a tuple shape), and whatever computed its operands stays, as an
                  output of the module if nothing else uses it (a removed root is replaced in the
                  result by its operands); in a called computation each becomes a zero constant.
                  Removing a chunk thus removes exactly that chunk, so delta debugging converges
                  on the few instructions a failure needs.
    outputs       (chunked) drop elements of the entry's result tuple, and with them whatever only
                  they needed.
    merge         (one at a time) every use of X uses Y instead, Y of the same shape and not
                  computed from X: an operand of X (X bypassed), or a nearby value (two
                  parameters become one, a reducer's root becomes one of its parameters).
    shapes        (one at a time) every dimension of size d in every shape becomes 1, or d/2.

Every edit works on a copy and ends in `normalize`: operands before users, dead code, unused
entry parameters and computations nobody calls gone, parameters renumbered, program shapes
recomputed. Whether a candidate is *valid* is ncc's verifier's to say (the reducer runs it on each
candidate before trying it); an edit only refuses what it can tell is hopeless. Instruction names
survive every edit (the parameter that replaced X is named X). Nothing here runs a tool.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

from ncc.schemas import hlo_pb2
from ncc.tools.hlo.hlo_types import T, element_count, entry_computation, is_tuple, leaf_shapes, same_shape

Module = hlo_pb2.HloModuleProto
Computation = hlo_pb2.HloComputationProto
Instr = hlo_pb2.HloInstructionProto

MERGE_NEIGHBOURS = 2  # same-shaped values tried as a replacement for each instruction, nearest first
MAX_CONSTANT_ELEMENTS = 1024  # the largest constant a removed instruction of a called computation becomes
_FRESH_PARAMETER = 1 << 40  # parameter numbers of new parameters, renumbered after the old ones
_ZERO_BYTES = {T.S8: 1, T.U8: 1, T.S16: 2, T.U16: 2, T.F16: 2, T.BF16: 2}
_LITERAL_FIELDS = {
    T.PRED: "preds", T.S8: "s8s", T.U8: "u8s", T.S16: "s16s", T.U16: "u16s", T.S32: "s32s", T.S64: "s64s",
    T.U32: "u32s", T.U64: "u64s", T.F16: "f16s", T.BF16: "bf16s", T.F32: "f32s",
}


@dataclass(frozen=True)
class Target:
    """One thing an edit can change: an instruction (`ids` one id), a pair for `merge` (old,
    new), a dimension size for `shapes` (old, new); `name` says which in instruction names."""

    name: str
    comp: int  # the computation's id (0 for shapes: every computation)
    ids: tuple[int, ...]


@dataclass(frozen=True)
class Candidate:
    """A module an edit made from the current one; `description` says what it did."""

    description: str
    edit: str
    module: Module
    size: int  # instructions, over all computations
    elements: int  # array elements of every instruction's result


@dataclass(frozen=True)
class Edit:
    name: str
    chunked: bool  # delta debugging over chunks of the targets, or one target at a time
    targets: Callable[[Module], list[Target]]
    apply: Callable[[Module, list[Target]], Module | None]
    verb: str  # how a candidate is described: "remove", "drop output", "merge", "shape"

    def make(self, module: Module, targets: list[Target]) -> Candidate | None:
        """The candidate this edit makes of `module` with `targets`, normalized; None if none."""
        made = self.apply(module, targets)
        if made is None or not normalize(made):
            return None
        if len(targets) == 1:
            what = targets[0].name
        else:
            what = f"{len(targets)} ({targets[0].name} .. {targets[-1].name})"
        return Candidate(f"{self.verb} {what}", self.name, made, instruction_count(made), element_total(made))


def instruction_count(module: Module) -> int:
    return sum(len(comp.instructions) for comp in module.computations)


def element_total(module: Module) -> int:
    return sum(
        element_count(leaf)
        for comp in module.computations
        for instr in comp.instructions
        for leaf in leaf_shapes(instr.shape)
    )


def cleanup(module: Module) -> Candidate | None:
    """The module itself, normalized: its dead code and unused parameters gone."""
    copy = _copy(module)
    if not normalize(copy):
        return None
    return Candidate("remove dead code", "cleanup", copy, instruction_count(copy), element_total(copy))


# -- normalization --------------------------------------------------------------------------------


def normalize(module: Module) -> bool:
    """In place: operands before users, dead code and unused entry parameters and computations
    gone, parameters numbered 0.., program shapes recomputed. False if an edit made a cycle or
    left a computation without its root."""
    entry = entry_computation(module)
    if entry is None:
        return False
    for comp in module.computations:
        if not _sort_and_sweep(comp, keep_parameters=comp is not entry):
            return False
    _renumber_parameters(entry)
    _drop_uncalled(module, entry)
    for comp in module.computations:
        _program_shape(comp)
    module.host_program_shape.CopyFrom(entry.program_shape)
    del module.host_program_shape.parameter_names[:]
    count = len(entry.program_shape.parameters)
    module.host_program_shape.parameter_names.extend(f"p{i}" for i in range(count))
    return True


def _sort_and_sweep(comp: Computation, keep_parameters: bool) -> bool:
    """Keep what the root needs (operands and control predecessors), and a called computation's
    parameters (its signature), in an order where each operand comes before its users (the
    existing order wherever it already does)."""
    by_id = {instr.id: instr for instr in comp.instructions}
    if comp.root_id not in by_id:
        return False
    live: set[int] = set()
    stack = [comp.root_id]
    if keep_parameters:
        stack += [i.id for i in comp.instructions if i.opcode == "parameter"]
    while stack:
        ident = stack.pop()
        if ident in live or ident not in by_id:
            continue
        live.add(ident)
        stack.extend(by_id[ident].operand_ids)
        stack.extend(by_id[ident].control_predecessor_ids)
    order: list[int] = []
    state: dict[int, int] = {}  # 1 visiting, 2 placed
    for instr in comp.instructions:
        if instr.id not in live or state.get(instr.id) == 2:
            continue
        work = [(instr.id, 0)]
        state[instr.id] = 1
        while work:
            ident, child = work[-1]
            deps = [*by_id[ident].operand_ids, *by_id[ident].control_predecessor_ids]
            if child < len(deps):
                work[-1] = (ident, child + 1)
                dep = deps[child]
                if dep not in by_id:
                    return False
                if state.get(dep) == 1:
                    return False  # a cycle
                if dep not in state:
                    state[dep] = 1
                    work.append((dep, 0))
                continue
            work.pop()
            state[ident] = 2
            order.append(ident)
    for ident in order:
        instr = by_id[ident]
        if any(p not in live for p in instr.control_predecessor_ids):
            preds = [p for p in instr.control_predecessor_ids if p in live]
            del instr.control_predecessor_ids[:]
            instr.control_predecessor_ids.extend(preds)
    if [i.id for i in comp.instructions] != order:
        kept = []
        for ident in order:
            copy = Instr()
            copy.CopyFrom(by_id[ident])
            kept.append(copy)
        del comp.instructions[:]
        comp.instructions.extend(kept)
    return True


def _parameters(comp: Computation) -> list[Instr]:
    params = [i for i in comp.instructions if i.opcode == "parameter"]
    return sorted(params, key=lambda i: i.parameter_number)


def _renumber_parameters(entry: Computation) -> None:
    for number, param in enumerate(_parameters(entry)):
        param.parameter_number = number


def _drop_uncalled(module: Module, entry: Computation) -> None:
    by_id = {comp.id: comp for comp in module.computations}
    called: set[int] = set()
    stack = [entry.id]
    while stack:
        ident = stack.pop()
        if ident in called or ident not in by_id:
            continue
        called.add(ident)
        stack.extend(c for i in by_id[ident].instructions for c in i.called_computation_ids)
    if len(called) < len(module.computations):
        kept = [comp for comp in module.computations if comp.id in called]
        copies = []
        for comp in kept:
            copy = Computation()
            copy.CopyFrom(comp)
            copies.append(copy)
        del module.computations[:]
        module.computations.extend(copies)


def _program_shape(comp: Computation) -> None:
    comp.ClearField("program_shape")
    for param in _parameters(comp):
        comp.program_shape.parameters.append(param.shape)
        comp.program_shape.parameter_names.append(param.name)
    root = next(i for i in comp.instructions if i.id == comp.root_id)
    comp.program_shape.result.CopyFrom(root.shape)


# -- helpers --------------------------------------------------------------------------------------


def _copy(module: Module) -> Module:
    copy = Module()
    copy.CopyFrom(module)
    return copy


def _entry(module: Module) -> Computation:
    entry = entry_computation(module)
    assert entry is not None
    return entry


def _find(module: Module, comp_id: int) -> Computation:
    return next(comp for comp in module.computations if comp.id == comp_id)


def _next_id(module: Module) -> int:
    return 1 + max((i.id for comp in module.computations for i in comp.instructions), default=0)


def _outputs(comp: Computation) -> list[int]:
    """The entry's results: a root tuple's operands, or the root."""
    root = next(i for i in comp.instructions if i.id == comp.root_id)
    return list(root.operand_ids) if root.opcode == "tuple" else [root.id]


def _removable(comp: Computation, is_entry: bool) -> list[Instr]:
    """What the `instructions` edit may take out: not parameters or constants (as small as a value
    gets), not the entry's root tuple (that is `outputs`' business), in a called computation
    nothing a constant cannot stand for."""
    root = comp.root_id
    out = []
    for instr in comp.instructions:
        if instr.opcode in ("parameter", "constant"):
            continue
        if is_entry and instr.id == root and instr.opcode == "tuple":
            continue
        if not is_entry and (is_tuple(instr.shape) or element_count(instr.shape) > MAX_CONSTANT_ELEMENTS):
            continue
        out.append(instr)
    return out


def _set_outputs(module: Module, comp: Computation, outputs: list[int]) -> bool:
    if not outputs:
        return False
    root = next(i for i in comp.instructions if i.id == comp.root_id)
    if len(outputs) == 1:
        comp.root_id = outputs[0]
        return True
    shapes = {i.id: i.shape for i in comp.instructions}
    if root.opcode != "tuple":
        names = {i.name for i in comp.instructions}
        root = comp.instructions.add(id=_next_id(module), name=_unique("outputs", names), opcode="tuple")
        comp.root_id = root.id
    del root.operand_ids[:]
    root.operand_ids.extend(outputs)
    root.shape.Clear()
    root.shape.element_type = T.TUPLE
    root.shape.tuple_shapes.extend(shapes[i] for i in outputs)
    return True


def _unique(name: str, taken: set[str]) -> str:
    candidate_name, n = name, 1
    while candidate_name in taken:
        candidate_name = f"{name}.{n}"
        n += 1
    taken.add(candidate_name)
    return candidate_name


def _to_parameter(instr: Instr, serial: int) -> None:
    name, ident, shape = instr.name, instr.id, hlo_pb2.ShapeProto()
    shape.CopyFrom(instr.shape)
    instr.Clear()
    instr.name, instr.id, instr.opcode = name, ident, "parameter"
    instr.shape.CopyFrom(shape)
    instr.parameter_number = _FRESH_PARAMETER + serial


def _to_parameters(module: Module, comp: Computation, instr: Instr, serial: int) -> int:
    """X (a tuple) becomes tuple(parameters...), recursively; returns the next serial."""
    names = {i.name for i in comp.instructions}
    operands = []
    for index, sub in enumerate(instr.shape.tuple_shapes):
        param = comp.instructions.add(id=_next_id(module), name=_unique(f"{instr.name}.{index}", names))
        param.shape.CopyFrom(sub)
        if is_tuple(sub):
            param.opcode = "tuple"
            serial = _to_parameters(module, comp, param, serial)
        else:
            _to_parameter(param, serial)
            serial += 1
        operands.append(param.id)
    shape = hlo_pb2.ShapeProto()
    shape.CopyFrom(instr.shape)
    name, ident = instr.name, instr.id
    instr.Clear()
    instr.name, instr.id, instr.opcode = name, ident, "tuple"
    instr.shape.CopyFrom(shape)
    instr.operand_ids.extend(operands)
    return serial


def _to_constant(instr: Instr) -> bool:
    """X becomes a constant of zeros of its shape (an array of at most MAX_CONSTANT_ELEMENTS)."""
    shape = hlo_pb2.ShapeProto()
    shape.CopyFrom(instr.shape)
    field = _LITERAL_FIELDS.get(shape.element_type)
    count = element_count(shape)
    if field is None or is_tuple(shape) or count > MAX_CONSTANT_ELEMENTS:
        return False
    name, ident = instr.name, instr.id
    instr.Clear()
    instr.name, instr.id, instr.opcode = name, ident, "constant"
    instr.shape.CopyFrom(shape)
    literal = instr.literal
    literal.shape.CopyFrom(shape)
    if shape.element_type in _ZERO_BYTES:
        setattr(literal, field, bytes(count * _ZERO_BYTES[shape.element_type]))
    elif shape.element_type == T.PRED:
        literal.preds.extend([False] * count)
    else:
        getattr(literal, field).extend([0] * count)
    return True


def _depends_on(by_id: dict[int, Instr], start: int, target: int) -> bool:
    stack, seen = [start], set()
    while stack:
        ident = stack.pop()
        if ident == target:
            return True
        if ident in seen or ident not in by_id:
            continue
        seen.add(ident)
        stack.extend(by_id[ident].operand_ids)
        stack.extend(by_id[ident].control_predecessor_ids)
    return False


def _same(a: hlo_pb2.ShapeProto, b: hlo_pb2.ShapeProto) -> bool:
    if not same_shape(a, b):
        return False
    return is_tuple(a) or list(a.layout.minor_to_major) == list(b.layout.minor_to_major)


def merge(module: Module, comp_id: int, old: int, new: int) -> Module | None:
    """A copy of `module` in which every use of `old` (and its being the root) is `new`'s."""
    result = _copy(module)
    comp = _find(result, comp_id)
    by_id = {i.id: i for i in comp.instructions}
    if not _same(by_id[old].shape, by_id[new].shape) or _depends_on(by_id, new, old):
        return None
    for instr in comp.instructions:
        if old in instr.operand_ids:
            operands = [new if o == old else o for o in instr.operand_ids]
            del instr.operand_ids[:]
            instr.operand_ids.extend(operands)
        if old in instr.control_predecessor_ids:
            preds = [p for p in instr.control_predecessor_ids if p != old]
            del instr.control_predecessor_ids[:]
            instr.control_predecessor_ids.extend(preds)
    if comp.root_id == old:
        comp.root_id = new
    return result


def substitute_size(module: Module, old: int, new: int) -> Module:
    """A copy of `module` with every dimension of size `old` in every shape made `new`."""
    result = _copy(module)

    def fix(shape: hlo_pb2.ShapeProto) -> None:
        if is_tuple(shape):
            for sub in shape.tuple_shapes:
                fix(sub)
        elif old in shape.dimensions:
            sizes = [new if d == old else d for d in shape.dimensions]
            del shape.dimensions[:]
            shape.dimensions.extend(sizes)

    for comp in result.computations:
        for instr in comp.instructions:
            fix(instr.shape)
            if instr.HasField("literal"):
                fix(instr.literal.shape)
    return result




# -- the four kinds of edit -----------------------------------------------------------------------


def _removal_targets(module: Module) -> list[Target]:
    """The entry's removable instructions in order, then those of the called computations."""
    entry = _entry(module)
    comps = [entry, *(comp for comp in module.computations if comp is not entry)]
    return [
        Target(instr.name, comp.id, (instr.id,))
        for comp in comps
        for instr in _removable(comp, comp is entry)
    ]


def _cut_entry(module: Module, comp: Computation, removed: set[int]) -> bool:
    by_id = {i.id: i for i in comp.instructions}
    root = by_id[comp.root_id]
    kept = [o for o in _outputs(comp) if o not in removed]
    serial = 0
    for instr in list(comp.instructions):
        if instr.id not in removed:
            continue
        if is_tuple(instr.shape):
            serial = _to_parameters(module, comp, instr, serial)
        else:
            _to_parameter(instr, serial)
            serial += 1
    result_tuple = root.id if root.opcode == "tuple" else None
    used = {o for i in comp.instructions if i.id != result_tuple for o in i.operand_ids}
    orphans = [
        i.id
        for i in comp.instructions
        if i.id not in used
        and i.id not in kept
        and i.id != result_tuple
        and i.opcode not in ("parameter", "constant")
        and not is_tuple(i.shape)
    ]
    if not kept and not orphans:  # nothing computed is left: the module returns a parameter
        orphans = [i.id for i in comp.instructions if i.opcode == "parameter" and not is_tuple(i.shape)][:1]
    return _set_outputs(module, comp, kept + orphans)


def cut(module: Module, targets: list[Target]) -> Module | None:
    """Remove the target instructions (the `instructions` edit, see the module docstring)."""
    result = _copy(module)
    entry = _entry(result)
    by_comp: dict[int, set[int]] = {}
    for target in targets:
        by_comp.setdefault(target.comp, set()).update(target.ids)
    for comp_id, removed in by_comp.items():
        comp = _find(result, comp_id)
        if comp is entry:
            if not _cut_entry(result, comp, removed):
                return None
            continue
        by_id = {i.id: i for i in comp.instructions}
        if not all(_to_constant(by_id[ident]) for ident in removed):
            return None
    return result


def _output_targets(module: Module) -> list[Target]:
    entry = _entry(module)
    outputs = _outputs(entry)
    if len(outputs) < 2:
        return []
    names = {i.id: i.name for i in entry.instructions}
    return [Target(names[o], entry.id, (o,)) for o in outputs]


def drop_outputs(module: Module, targets: list[Target]) -> Module | None:
    """Drop the target elements of the entry's result tuple (and what only they needed)."""
    result = _copy(module)
    entry = _entry(result)
    dropped = {ident for target in targets for ident in target.ids}
    rest = [o for o in _outputs(entry) if o not in dropped]
    return result if _set_outputs(result, entry, rest) else None


def _merge_targets(module: Module) -> list[Target]:
    """For each instruction: its operands of the same shape (bypass it), then the nearest other
    values of its shape that are not computed from it."""
    targets = []
    for comp in module.computations:
        instrs = list(comp.instructions)
        by_id = {i.id: i for i in instrs}
        for position, instr in enumerate(instrs):
            tried: set[int] = set()
            for operand in instr.operand_ids:
                if operand not in tried and _same(by_id[operand].shape, instr.shape):
                    tried.add(operand)
                    name = f"{instr.name} -> {by_id[operand].name}"
                    targets.append(Target(name, comp.id, (instr.id, operand)))
            found = 0
            for _, other in sorted((abs(o - position), o) for o in range(len(instrs)) if o != position):
                y = instrs[other]
                if found >= MERGE_NEIGHBOURS:
                    break
                if y.id in tried or not _same(y.shape, instr.shape) or _depends_on(by_id, y.id, instr.id):
                    continue
                if instr.opcode == "parameter" and y.opcode == "parameter" and other > position:
                    continue  # two parameters merge one way only
                tried.add(y.id)
                found += 1
                targets.append(Target(f"{instr.name} -> {y.name}", comp.id, (instr.id, y.id)))
    return targets


def _merge(module: Module, targets: list[Target]) -> Module | None:
    result: Module | None = module
    for target in targets:
        old, new = target.ids
        result = merge(result, target.comp, old, new) if result is not None else None
    return result


def _size_targets(module: Module) -> list[Target]:
    sizes = {
        d
        for comp in module.computations
        for instr in comp.instructions
        for leaf in leaf_shapes(instr.shape)
        for d in leaf.dimensions
        if d > 1
    }
    targets = []
    for size in sorted(sizes, reverse=True):
        for smaller in dict.fromkeys((1, size // 2)):
            if 0 < smaller < size:
                targets.append(Target(f"{size} -> {smaller}", 0, (size, smaller)))
    return targets


def _shrink(module: Module, targets: list[Target]) -> Module | None:
    result = module
    for target in targets:
        result = substitute_size(result, *target.ids)
    return result


EDITS: tuple[Edit, ...] = (
    Edit("instructions", True, _removal_targets, cut, "remove"),
    Edit("outputs", True, _output_targets, drop_outputs, "drop output"),
    Edit("merge", False, _merge_targets, _merge, "merge"),
    Edit("shapes", False, _size_targets, _shrink, "shape"),
)
