"""The Penguin optimizer over a program with Repeat regions (while loops kept as loops), one
segment at a time.

Why: every pass reasons about one run of the program, nest after nest, and a region's nests run
once per trip: its first nest reads what its last one wrote at the trip before, and its HBM
accesses move from trip to trip. Cut at every region's edges, each segment is a straight-line
program again, which the passes optimize as they are: a region's nests as its trip 0 (every trip
is trip 0 moved along whole tensors, so what holds for one holds for all), and no nest fuses
with, or moves across, a region's edge.

Each segment is optimized as a program of its own that declares every tensor. So that the passes
keep what other segments need, a tensor the segment writes is made an output while they run when
another segment reads it, or (in a region) when the region reads it at or before its first
write there: the next trip reads that value. Afterwards the segments' nests join again in order,
with their tensors; a name two segments made for different things is renamed in the later one.
"""

from __future__ import annotations

from collections.abc import Callable
from itertools import groupby

from ncc.schemas import penguin_pb2
from ncc.tools.common.loops import REPEAT
from ncc.tools.hlo_opt.nonfinite import SEEDED, nonfinite_tensors


def optimize_segments(program: penguin_pb2.Program, run: Callable[[penguin_pb2.Program], None]) -> None:
    """Run `run` (the pass list) on each segment of `program` and join the results in place."""
    bases = {t.name: t.view_of or t.name for t in program.tensors}
    nonfinite = ",".join(sorted(nonfinite_tensors(program)))  # a segment alone misses earlier writers
    segments = [(region, list(nests)) for region, nests in
                groupby(program.nests, key=lambda nest: nest.attributes.get(REPEAT, ""))]
    reads = [_bases(nests, bases, inputs=True) for _, nests in segments]
    optimized: list[penguin_pb2.Program] = []
    for k, (region, nests) in enumerate(segments):
        sub = penguin_pb2.Program(name=program.name)
        sub.attributes.update(program.attributes)
        sub.attributes[SEEDED] = nonfinite
        sub.tensors.extend(program.tensors)
        sub.nests.extend(nests)
        elsewhere = set().union(*(r for j, r in enumerate(reads) if j != k))
        carried = _carried(nests, bases) if region else set()
        keep = _bases(nests, bases, inputs=False) & (elsewhere | carried)
        marked = {t.name for t in sub.tensors if t.name in keep and t.role == penguin_pb2.INTERNAL}
        for tensor in sub.tensors:
            if tensor.name in marked:
                tensor.role = penguin_pb2.OUTPUT
        run(sub)
        for tensor in sub.tensors:
            if tensor.name in marked:
                tensor.role = penguin_pb2.INTERNAL
        for nest in sub.nests:
            if region:
                nest.attributes[REPEAT] = region
            elif REPEAT in nest.attributes:
                del nest.attributes[REPEAT]
        optimized.append(sub)
    _join(program, optimized)


def _bases(nests: list[penguin_pb2.LoopNest], bases: dict[str, str], inputs: bool) -> set[str]:
    return {bases.get(a.tensor, a.tensor) for nest in nests for st in nest.statements
            for a in (st.inputs if inputs else st.outputs)}


def _carried(nests: list[penguin_pb2.LoopNest], bases: dict[str, str]) -> set[str]:
    """The tensors a region reads at or before its first write of them: one trip's value for the next."""
    read: set[str] = set()
    written: set[str] = set()
    carried: set[str] = set()
    for nest in nests:
        writes = _bases([nest], bases, inputs=False)
        read |= _bases([nest], bases, inputs=True)
        carried |= (writes - written) & read
        written |= writes
    return carried


def _join(program: penguin_pb2.Program, parts: list[penguin_pb2.Program]) -> None:
    """`program`'s nests become the parts' in order, its tensors theirs (each name once)."""
    original = {t.name for t in program.tensors}
    tensors: dict[str, penguin_pb2.TensorDecl] = {}
    owned: set[str] = set()  # tensors taken from a part that names them (passes may change their decl)
    nest_names: set[str] = set()
    nests: list[penguin_pb2.LoopNest] = []
    for part in parts:
        renames: dict[str, str] = {}
        named = {a.tensor for nest in part.nests for st in nest.statements for a in (*st.inputs, *st.outputs)}
        named |= {t.view_of for t in part.tensors if t.name in named and t.view_of}
        for tensor in part.tensors:
            if tensor.name in tensors and tensor.name not in original \
                    and tensors[tensor.name].SerializeToString(deterministic=True) \
                    != tensor.SerializeToString(deterministic=True):
                renames[tensor.name] = _fresh(tensor.name, tensors)
                tensor.name = renames[tensor.name]
            if tensor.name not in tensors or (tensor.name in named and tensor.name not in owned):
                tensors[tensor.name] = tensor
            if tensor.name in named:
                owned.add(tensor.name)
        for tensor in part.tensors:
            if tensor.view_of in renames:
                tensor.view_of = renames[tensor.view_of]
        for nest in part.nests:
            if nest.name in nest_names:
                nest.name = _fresh(nest.name, nest_names)
            nest_names.add(nest.name)
            for st in nest.statements:
                for access in (*st.inputs, *st.outputs):
                    access.tensor = renames.get(access.tensor, access.tensor)
            nests.append(nest)
    del program.nests[:]
    program.nests.extend(nests)
    del program.tensors[:]
    program.tensors.extend(tensors.values())


def _fresh(name: str, taken) -> str:
    n = 2
    while f"{name}_{n}" in taken:
        n += 1
    return f"{name}_{n}"
