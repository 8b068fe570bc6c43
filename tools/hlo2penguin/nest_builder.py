"""Build Penguin loop nests over 128-partition tiles: tensors, views, boxes and statements.

Lowering code says *what* a nest computes (load these operands, apply this op, store there);
this module owns *how* that is written down: canonical tile shapes, axis names, affine tile starts,
unique names, view declarations (every HBM access goes through a declared view), and the partial
last tile (an access's extent is clipped at the tensor's logical shape by the consumer).
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field

from ncc.schemas import common_pb2, penguin_pb2
from ncc.tools.common import affine
from ncc.tools.hlo2penguin.views import View
from ncc.tools.target import PARTITIONS

FRONTEND_PREFIX = "frontend:"  # attribute keys carried over from HLO frontend_attributes


def canonical_shape(shape: tuple[int, ...]) -> tuple[int, ...]:
    """The rank >= 2 shape a tiled op works on: () -> (1, 1); (n,) -> (p, n / p) with p the largest
    divisor of n up to 128, so a vector fills the partitions instead of one element per partition
    (a prime n > 128 gives (1, n)); rank >= 2 is unchanged."""
    if len(shape) == 0:
        return (1, 1)
    if len(shape) == 1:
        n = shape[0]
        if n == 0:
            return (0, 1)
        rows = max(d for d in range(1, min(n, PARTITIONS) + 1) if n % d == 0)
        return (rows, n // rows)
    return tuple(shape)


@dataclass
class Tiling:
    """How a canonical shape (leading..., rows, cols) is cut: axis names and tile sizes per dim."""

    shape: tuple[int, ...]
    free_tile: int
    row_axis: str = "i"
    col_axis: str = "j"

    @property
    def leading_axes(self) -> list[str]:
        return [f"b{d}" for d in range(len(self.shape) - 2)]

    def axes(self) -> list[penguin_pb2.Axis]:
        rows, cols = self.shape[-2], self.shape[-1]
        axes = [penguin_pb2.Axis(name=name, extent=size)
                for name, size in zip(self.leading_axes, self.shape, strict=False)]
        axes.append(penguin_pb2.Axis(name=self.row_axis, extent=ceil_div(rows, PARTITIONS)))
        axes.append(penguin_pb2.Axis(name=self.col_axis, extent=ceil_div(cols, self.free_tile)))
        return axes

    def col_tiles(self) -> int:
        return ceil_div(self.shape[-1], self.free_tile)

    def box(self, tensor: str, col_tile: int | None = None) -> penguin_pb2.Access:
        """The (1.., 128, free_tile) box at the current tile; col_tile=1 for a per-row result."""
        cols = self.free_tile if col_tile is None else col_tile
        starts = [affine.expr({name: 1}) for name in self.leading_axes]
        starts.append(affine.expr({self.row_axis: PARTITIONS}))
        starts.append(affine.expr({self.col_axis: cols}) if col_tile is None else affine.expr())
        extents = [1] * len(self.leading_axes) + [PARTITIONS, cols]
        return penguin_pb2.Access(tensor=tensor, starts=starts, extents=extents)


def ceil_div(a: int, b: int) -> int:
    return -(-a // b)


@dataclass
class ProgramBuilder:
    """Accumulates tensors and nests of one Penguin program, keeping every name unique."""

    program: penguin_pb2.Program
    _names: set[str] = field(default_factory=set)
    _suffix: dict[str, int] = field(default_factory=dict)
    _views: dict[tuple, str] = field(default_factory=dict)

    def unique(self, hint: str) -> str:
        """`hint` made a valid, unused name (`hint_2`, `hint_3`... on reuse; each base remembers its
        last suffix, so naming stays linear when a loop reuses one hint thousands of times)."""
        base = re.sub(r"[^A-Za-z0-9_.]", "_", hint) or "t"
        name, n = base, self._suffix.get(base, 1)
        while name in self._names:
            n += 1
            name = f"{base}_{n}"
        self._suffix[base] = n
        self._names.add(name)
        return name

    def snapshot(self) -> tuple:
        """What `restore` needs to take back everything declared and named after this point (a
        trial lowering: repeat.py)."""
        counts = len(self.program.tensors), len(self.program.nests)
        return (*counts, set(self._names), dict(self._suffix), dict(self._views))

    def restore(self, mark: tuple) -> None:
        tensors, nests, names, suffix, views = mark
        del self.program.tensors[tensors:]
        del self.program.nests[nests:]
        self._names, self._suffix, self._views = set(names), dict(suffix), dict(views)

    def tensor(self, hint: str, **fields) -> str:
        name = self.unique(hint)
        self.program.tensors.add(name=name, **fields)
        return name

    def decl(self, name: str) -> penguin_pb2.TensorDecl:
        for tensor in self.program.tensors:
            if tensor.name == name:
                return tensor
        raise KeyError(name)

    def hbm_tensor(self, hint: str, dtype: int, shape: tuple[int, ...], role: int, source: str,
                   **extra) -> str:
        return self.tensor(
            hint, dtype=dtype, shape=list(shape), memory=common_pb2.HBM, role=role, source=source, **extra
        )

    def view(self, view: View) -> str:
        """Declare (once) the HBM view tensor that nests access `view` through."""
        key = (view.base, view.dtype, view.shape, view.strides, view.offset)
        if key not in self._views:
            self._views[key] = self.tensor(
                f"{view.base}.v",
                dtype=view.dtype,
                shape=list(view.shape),
                memory=common_pb2.HBM,
                role=penguin_pb2.INTERNAL,
                view_of=view.base,
                view_offset=view.offset,
                view_strides=list(view.strides),
            )
        return self._views[key]

    def tile(self, hint: str, dtype: int, shape: tuple[int, ...], block: tuple[int, ...],
             memory: int = common_pb2.SBUF) -> str:
        return self.tensor(hint, dtype=dtype, shape=list(shape), memory=memory, block_shape=list(block),
                           role=penguin_pb2.INTERNAL)

    def nest(self, hint: str, source: str, axes: list[penguin_pb2.Axis],
             attributes: dict[str, str] | None = None) -> penguin_pb2.LoopNest:
        nest = self.program.nests.add(name=self.unique(hint), source=source)
        nest.axes.extend(axes)
        for key, value in (attributes or {}).items():
            nest.attributes[key] = value
        return nest


def add_statement(
    nest: penguin_pb2.LoopNest,
    name: str,
    op: str,
    engine: int,
    outputs: list[penguin_pb2.Access],
    inputs: list[penguin_pb2.Access],
    *,
    func: str = "",
    scalars: tuple[float, ...] = (),
    predicates: tuple[penguin_pb2.Predicate, ...] = (),
    attributes: dict[str, str] | None = None,
) -> penguin_pb2.Statement:
    statement = nest.statements.add(name=name, op=op, engine=engine, func=func, source=nest.source)
    statement.outputs.extend(outputs)
    statement.inputs.extend(inputs)
    statement.scalars.extend(scalars)
    statement.predicates.extend(predicates)
    for key, value in nest.attributes.items():  # the HLO op's frontend attributes stay on what it became
        if key.startswith(FRONTEND_PREFIX):
            statement.attributes[key] = value
    for key, value in (attributes or {}).items():
        statement.attributes[key] = value
    return statement


def unwritten_read(program: penguin_pb2.Program) -> str | None:
    """The first nest that reads an internal HBM tensor (directly or through a view) before any
    nest writes it, as a sentence; None when there is none. Such a read sees memory nothing
    wrote: the lowering opened a nest, then emitted the nest that fills one of its inputs after
    it (a constant gather index once did exactly this, silently)."""
    tensors = {t.name: t for t in program.tensors}

    def base(name: str) -> str:
        while name in tensors and tensors[name].view_of:
            name = tensors[name].view_of
        return name

    internal = {t.name for t in program.tensors
                if t.memory == common_pb2.HBM and t.role == penguin_pb2.INTERNAL and not t.view_of}
    written: set[str] = set()
    for nest in program.nests:
        writes = {base(a.tensor) for st in nest.statements for a in st.outputs}
        for st in nest.statements:
            for access in st.inputs:
                tensor = base(access.tensor)
                if tensor in internal and tensor not in written and tensor not in writes:
                    return f"nest '{nest.name}' reads '{tensor}' before any nest writes it"
        written |= writes
    return None
