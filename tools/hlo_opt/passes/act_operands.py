"""Activation operands: ACT's per-partition bias and its row sum take work off DVE.

ACT computes func(in·scale + bias) where the bias may be a [P, 1] tile (NKI's `activation` takes a
vector bias), and it can add up along each partition what it writes (NKI's `activation_reduce`),
at no cost beyond the activation's own (docs/ir.md, activation). A softmax spends two DVE passes
over every score tile on exactly these: x − max before the exp, and the row sum of the exp after
it (BERT's layer: 49 of its 170 µs of softmax DVE work). Within one nest this pass

  * folds a `tensor_tensor` subtract (or add) of a per-partition operand into the activation
    that alone reads its result: exp(x − m) becomes exp(x + (−m)), the activation reading x and a
    [P, 1] tile −m that a one-element-per-partition `tensor_scalar` computes where the subtract was;
  * folds a `tensor_reduce` add of an activation's output into the activation, as its second
    output;
  * makes a `tensor_tensor` multiply of a tile by itself that a `tensor_reduce` add reads an
    ACT `square` with that sum as its second output: a norm's sum of squares (layer norm's
    variance, RMSNorm's mean square) was two DVE passes over the tile, three streams in all
    (x·x reads x twice), and is now one ACT pass.

  * moves a `tensor_tensor` add or subtract of a [P, 1] column that DVE computes on its own
    (a batch norm's − mean and + beta over channel-major tiles, a norm's − mean over rows) to
    ACT as an identity activation with that bias, while the nest's DVE work (DVE and POOL share
    a port) exceeds ACT's: ResNet's batch norms were four DVE passes a tile and one on ACT.
    A subtract takes the negated column, computed in a one-element-per-partition `tensor_scalar`
    before it. The values are the subtract's and add's, −0 included: the activation adds its
    scalar bias of −0 first (alu.IDENTITY_SCALE_BIAS), which changes no value.
    When the moved statement's result only feeds a max(·, 0) on DVE (a ReLU after the norm), the
    activation computes the relu itself (ACT's relu is that maximum), and the max goes.

The first three give bit for bit the results of the statements they replace: x + (−m) is x − m rounded
once, ACT's scale of 1 and bias of −0 change no value (the fold writes that bias: one of +0, or
none, would make −0 +0), and the sum adds the written values in the order tensor_reduce does. So
the fold applies only where those hold: the subtract writes f32 from float operands, the
activation has scale 1 and bias 0, the two run under the same predicates and nothing between them
writes what the activation now reads (or, for the sum, touches the reduce's output).
"""

from __future__ import annotations

from dataclasses import dataclass

from ncc.schemas import common_pb2, penguin_pb2
from ncc.tools.common.alu import IDENTITY_SCALE_BIAS
from ncc.tools.common.dtypes import is_float
from ncc.tools.hlo_opt.passes import nests_naming, same_box, writers_and_readers
from ncc.tools.hlo_opt.passes.broadcast_operands import BROADCAST, broadcast_inputs
from ncc.tools.target import load_target

_IDENTITY_SCALARS = ([], [1.0], [1.0, 0.0])  # scale 1, bias 0: the activation changes no input value
_PLACEMENT = ("stage", "stage_id", "execution_order")  # statement attributes that place it in a pipeline


@dataclass
class ActOperandStats:
    biases_folded: int = 0
    sums_folded: int = 0
    squares_folded: int = 0  # x·x with its row sum, now ACT's square (counted in sums_folded too)
    shifts_moved: int = 0  # column adds and subtracts moved from DVE to ACT
    relus_folded: int = 0  # of them, those whose max(·, 0) after them became their function


def fold_act_operands(program: penguin_pb2.Program) -> ActOperandStats:
    """Give activations the per-partition bias and the row sum that DVE computed for them."""
    stats = ActOperandStats()
    tensors = {t.name: t for t in program.tensors}
    nests_of = nests_naming(program)
    for index, nest in enumerate(program.nests):
        folder = _NestFolder(program, nest, index, tensors, nests_of)
        for k, st in enumerate(nest.statements):
            if st.op == "activation" and len(st.inputs) == 1 and len(st.outputs) == 1:
                stats.biases_folded += folder.fold_bias(k)
                stats.sums_folded += folder.fold_sum(k)
            elif folder.fold_square(k):
                stats.squares_folded += 1
                stats.sums_folded += 1
        folder.finish()
        moved = _balance_shifts(program, nest, tensors)
        stats.shifts_moved += len(moved)
        stats.relus_folded += _fold_relus(nest, moved, tensors, nests_of, index)
    return stats


class _NestFolder:
    """One nest's statements, who writes and reads each tensor (kept current as folds change
    them), and the statements a fold made redundant."""

    def __init__(
        self,
        program: penguin_pb2.Program,
        nest: penguin_pb2.LoopNest,
        index: int,
        tensors: dict[str, penguin_pb2.TensorDecl],
        nests_of: dict[str, set[int]],
    ) -> None:
        self.program, self.index = program, index
        self.statements = nest.statements
        self.tensors, self.nests_of = tensors, nests_of
        self.writers, self.readers = writers_and_readers(nest)
        self.dropped: set[int] = set()

    def fold_bias(self, k: int) -> int:
        """Fold the subtract (or add) of a [P, 1] tile that feeds activation k alone into it."""
        act = self.statements[k]
        tile = act.inputs[0]
        j = self._only_writer(tile.tensor, before=k)
        if j is None or self.readers[tile.tensor] != [k] or list(act.scalars) not in _IDENTITY_SCALARS:
            return 0
        shift = self.statements[j]
        if not (
            shift.op == "tensor_tensor"
            and len(shift.inputs) == 2
            and len(shift.outputs) == 1
            and same_box(shift.outputs[0], tile)
            and list(shift.outputs[0].extents) == list(act.outputs[0].extents)
            and _same_place(shift, act)
        ):
            return 0
        positions = broadcast_inputs(shift)
        if shift.func == "subtract" and positions == [1]:
            data, column = _copy(shift.inputs[0]), _copy(shift.inputs[1])
        elif shift.func == "add" and positions in ([0], [1]):
            data, column = _copy(shift.inputs[1 - positions[0]]), _copy(shift.inputs[positions[0]])
        else:
            return 0
        if not (
            self.tensors[tile.tensor].dtype == common_pb2.F32
            and is_float(self.tensors[data.tensor].dtype)
            and is_float(self.tensors[column.tensor].dtype)
        ):
            return 0
        if self._written_between(data.tensor, j, k) or self._written_between(column.tensor, j, k):
            return 0
        self._unlink(k)
        self._unlink(j)
        if shift.func == "subtract":
            bias = self._negate(j, column)
            self._link(j)
        else:
            bias = column
            self.dropped.add(j)
        del act.inputs[:]
        act.inputs.extend([data, bias])
        del act.scalars[:]
        act.scalars.extend(IDENTITY_SCALE_BIAS)  # data + column exactly, a −0 included (+0 or none: not)
        act.attributes[BROADCAST] = "1"
        self._link(k)
        return 1

    def fold_sum(self, k: int) -> int:
        """Fold the add-reduction of activation k's output into it, as its second output."""
        act = self.statements[k]
        out = act.outputs[0]
        r = next(
            (r for r in self.readers[out.tensor] if r > k and self._is_sum_of(self.statements[r], out)), None
        )
        if r is None or self._written_between(out.tensor, k, r):
            return 0
        reduce = self.statements[r]
        total = reduce.outputs[0]
        if not (
            _same_place(act, reduce)
            and is_float(self.tensors[total.tensor].dtype)
            and is_float(self.tensors[out.tensor].dtype)
        ):
            return 0
        if any(k < i < r for i in (*self.writers[total.tensor], *self.readers[total.tensor])):
            return 0
        self._unlink(k)
        self._unlink(r)
        act.outputs.append(total)
        self.dropped.add(r)
        self._link(k)
        return 1

    def fold_square(self, k: int) -> bool:
        """Make statement k, x·x on DVE, an ACT square if an add-reduction of its output then
        folds into it (fold_sum); else leave it as it was."""
        st = self.statements[k]
        if not (
            st.op == "tensor_tensor"
            and st.func == "multiply"
            and st.engine == common_pb2.DVE
            and len(st.inputs) == 2
            and len(st.outputs) == 1
            and st.inputs[0] == st.inputs[1]
            and not st.attributes.get(BROADCAST)
            and self.tensors[st.outputs[0].tensor].dtype == common_pb2.F32
            and is_float(self.tensors[st.inputs[0].tensor].dtype)
        ):
            return False
        before = penguin_pb2.Statement()
        before.CopyFrom(st)
        self._unlink(k)
        st.op, st.engine, st.func = "activation", common_pb2.ACT, "square"
        del st.inputs[1:]
        del st.scalars[:]
        st.scalars.extend(IDENTITY_SCALE_BIAS)
        self._link(k)
        if self.fold_sum(k):
            return True
        self._unlink(k)
        st.CopyFrom(before)
        self._link(k)
        return False

    def finish(self) -> None:
        if self.dropped:
            kept = [st for i, st in enumerate(self.statements) if i not in self.dropped]
            del self.statements[:]
            self.statements.extend(kept)

    def _only_writer(self, tensor: str, before: int) -> int | None:
        """The one statement of this nest that writes on-chip `tensor`, if it comes before `before`
        and no other nest names the tensor."""
        writers = self.writers[tensor]
        if (
            len(writers) != 1
            or writers[0] >= before
            or self.nests_of[tensor] != {self.index}
            or self.tensors[tensor].memory == common_pb2.HBM
        ):
            return None
        return writers[0]

    def _is_sum_of(self, st: penguin_pb2.Statement, out: penguin_pb2.Access) -> bool:
        return (
            st.op == "tensor_reduce"
            and st.func == "add"
            and len(st.inputs) == 1
            and len(st.outputs) == 1
            and st.inputs[0].tensor == out.tensor
            and same_box(st.inputs[0], out)
        )

    def _written_between(self, tensor: str, first: int, last: int) -> bool:
        return any(first < w < last for w in self.writers[tensor])

    def _negate(self, j: int, column: penguin_pb2.Access) -> penguin_pb2.Access:
        """Turn statement j into column × −1, written to a new tile like the column's."""
        shift = self.statements[j]
        negated = _negated_tile(self.program, self.tensors, column)
        self.nests_of[negated.tensor] = {self.index}
        shift.op, shift.func, shift.name = "tensor_scalar", "multiply", shift.name + ".neg"
        shift.engine = common_pb2.DVE
        del shift.scalars[:]
        shift.scalars.append(-1.0)
        shift.attributes.pop(BROADCAST, None)
        shift.attributes.pop("reverse", None)
        del shift.inputs[:]
        shift.inputs.append(column)
        del shift.outputs[:]
        shift.outputs.append(negated)
        return negated

    def _unlink(self, i: int) -> None:
        """Take statement i out of the writers and readers (before it changes or goes)."""
        st = self.statements[i]
        for access in st.inputs:
            self.readers[access.tensor] = [x for x in self.readers[access.tensor] if x != i]
        for access in st.outputs:
            self.writers[access.tensor] = [x for x in self.writers[access.tensor] if x != i]

    def _link(self, i: int) -> None:
        """Enter statement i's operands in the writers and readers, keeping each list in order."""
        st = self.statements[i]
        for access in st.inputs:
            self.readers[access.tensor] = sorted({*self.readers[access.tensor], i})
        for access in st.outputs:
            self.writers[access.tensor] = sorted({*self.writers[access.tensor], i})


def _balance_shifts(program: penguin_pb2.Program, nest: penguin_pb2.LoopNest,
                    tensors: dict[str, penguin_pb2.TensorDecl]) -> list[str]:
    """Move column adds and subtracts from DVE to ACT (module docstring) while that lowers the
    larger of the two engines' work in one iteration of the nest (one element a cycle a stream at
    each engine's clock); the names of those moved."""
    clock = load_target().clock_ghz
    act_ghz, dve_ghz = clock[common_pb2.ACT], clock[common_pb2.DVE]
    work = {common_pb2.ACT: 0.0, common_pb2.DVE: 0.0}
    for st in nest.statements:
        if st.engine in (common_pb2.DVE, common_pb2.POOL) and st.outputs:
            work[common_pb2.DVE] += _free(st) * max(1, len(st.inputs) - len(broadcast_inputs(st))) / dve_ghz
        elif st.engine == common_pb2.ACT and st.op != "dma" and st.outputs:
            work[common_pb2.ACT] += _free(st) / act_ghz
    negations: dict[int, penguin_pb2.Statement] = {}
    moved: list[str] = []
    for k, st in enumerate(nest.statements):
        column = _shift_column(st, tensors)
        if column is None:
            continue
        on_dve, on_act = _free(st) / dve_ghz, _free(st) / act_ghz
        if max(work[common_pb2.DVE] - on_dve, work[common_pb2.ACT] + on_act) >= \
                max(work[common_pb2.DVE], work[common_pb2.ACT]):
            continue
        moved.append(st.name)
        work[common_pb2.DVE] -= on_dve
        work[common_pb2.ACT] += on_act
        data, bias = _copy(st.inputs[1 - column]), _copy(st.inputs[column])
        if st.func == "subtract":
            negations[k], bias = _negation(program, tensors, st, bias)
        st.op, st.engine, st.func = "activation", common_pb2.ACT, "identity"
        del st.scalars[:]
        st.scalars.extend(IDENTITY_SCALE_BIAS)
        del st.inputs[:]
        st.inputs.extend([data, bias])
        st.attributes[BROADCAST] = "1"
    if negations:
        statements = []
        for k, st in enumerate(nest.statements):
            statements += [negations[k], st] if k in negations else [st]
        del nest.statements[:]
        nest.statements.extend(statements)
    return moved


def _fold_relus(nest: penguin_pb2.LoopNest, moved: list[str], tensors: dict[str, penguin_pb2.TensorDecl],
                nests_of: dict[str, set[int]], index: int) -> int:
    """Let each moved activation compute the max(·, 0) that alone reads its result (module
    docstring); the number folded."""
    statements = nest.statements
    writers, readers = writers_and_readers(nest)
    dropped: set[int] = set()
    for k, act in enumerate(statements):
        if act.name not in moved or act.op != "activation" or len(act.outputs) != 1:
            continue
        tile = act.outputs[0]
        users = readers[tile.tensor]
        if len(users) != 1 or nests_of.get(tile.tensor, {index}) != {index} or writers[tile.tensor] != [k]:
            continue
        relu = statements[users[0]]
        if not (users[0] > k and relu.op == "tensor_scalar" and relu.func == "maximum"
                and list(relu.scalars) == [0.0] and relu.engine == common_pb2.DVE
                and "reverse" not in relu.attributes
                and len(relu.outputs) == 1 and same_box(relu.inputs[0], tile)
                and list(relu.outputs[0].extents) == list(tile.extents)
                and tensors[relu.outputs[0].tensor].dtype == common_pb2.F32
                and _same_place(act, relu)):
            continue
        j = users[0]
        out = relu.outputs[0]
        if any(k < i < j for i in (*writers[out.tensor], *readers[out.tensor])) or \
                any(k < w < j for a in act.inputs for w in writers[a.tensor]):
            continue
        act.func = "relu"
        act.outputs[0].CopyFrom(out)
        dropped.add(j)
    if dropped:
        kept = [st for i, st in enumerate(statements) if i not in dropped]
        del statements[:]
        statements.extend(kept)
    return len(dropped)


def _shift_column(st: penguin_pb2.Statement, tensors: dict[str, penguin_pb2.TensorDecl]) -> int | None:
    """The position of the [P, 1] column that DVE statement `st` adds (either side) or subtracts
    (right side) from f32 data, if that is what it does; else None."""
    if st.op != "tensor_tensor" or st.engine != common_pb2.DVE or len(st.inputs) != 2 or len(st.outputs) != 1:
        return None
    positions = broadcast_inputs(st)
    if not (st.func == "subtract" and positions == [1] or st.func == "add" and positions in ([0], [1])):
        return None
    if tensors[st.outputs[0].tensor].dtype != common_pb2.F32 or \
            not all(is_float(tensors[a.tensor].dtype) for a in st.inputs):
        return None
    return positions[0]


def _negation(program: penguin_pb2.Program, tensors: dict[str, penguin_pb2.TensorDecl],
              st: penguin_pb2.Statement,
              column: penguin_pb2.Access) -> tuple[penguin_pb2.Statement, penguin_pb2.Access]:
    """A statement computing column × −1 into a new tile like the column's, under st's
    predicates and placement, and the access that reads it."""
    negated = _negated_tile(program, tensors, column)
    negate = penguin_pb2.Statement(name=st.name + ".neg", op="tensor_scalar", engine=common_pb2.DVE,
                                   func="multiply", scalars=[-1.0], source=st.source)
    negate.inputs.append(column)
    negate.outputs.append(negated)
    negate.predicates.extend(st.predicates)
    for key in _PLACEMENT:
        if key in st.attributes:
            negate.attributes[key] = st.attributes[key]
    return negate, negated


def _same_place(a: penguin_pb2.Statement, b: penguin_pb2.Statement) -> bool:
    """Whether two statements run at the same iterations and pipeline stage."""
    return list(a.predicates) == list(b.predicates) and all(
        a.attributes.get(key) == b.attributes.get(key) for key in _PLACEMENT
    )


def _negated_tile(program: penguin_pb2.Program, tensors: dict[str, penguin_pb2.TensorDecl],
                  column: penguin_pb2.Access) -> penguin_pb2.Access:
    """A new on-chip tile like `column`'s for its negation, declared in the program, and the
    access to it that mirrors `column`."""
    decl = program.tensors.add()
    decl.CopyFrom(tensors[column.tensor])
    name, n = column.tensor + ".neg", 1
    while name in tensors:
        n += 1
        name = f"{column.tensor}.neg{n}"
    decl.name = name
    # computed where the subtract was, at every iteration: a tile of its own at each, even where
    # the column is one tile kept across an axis (invariant_loads' replicated_dims)
    for field in ("view_of", "view_offset", "view_strides", "replicated_dims"):
        decl.ClearField(field)
    decl.role = penguin_pb2.INTERNAL
    tensors[name] = decl
    negated = _copy(column)
    negated.tensor = name
    return negated


def _free(st: penguin_pb2.Statement) -> int:
    """Elements per partition a statement writes: its first output's last extent."""
    return st.outputs[0].extents[-1] if st.outputs[0].extents else 1


def _copy(access: penguin_pb2.Access) -> penguin_pb2.Access:
    """A detached copy of an access (the statement it came from is about to change)."""
    copy = penguin_pb2.Access()
    copy.CopyFrom(access)
    return copy
