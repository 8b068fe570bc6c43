"""The Penguin passes, one module each, run by tools/hlo_opt/optimizer.py in the order of its
list (docs/architecture.md, The Penguin optimizer), and what several of them ask of a program."""

from __future__ import annotations

from collections import defaultdict

from ncc.schemas import penguin_pb2

# Statements that compute each output element from the same element of their inputs (an iota, and
# an affine_select's predicate, from its own index): what act_functions evaluates as a function of
# one tile, and what epilogues may retile to a dot's output tiles.
ELEMENTWISE_OPS = frozenset({"tensor_tensor", "tensor_scalar", "activation", "select", "tensor_copy", "iota",
                             "affine_select"})


def nests_naming(program: penguin_pb2.Program) -> dict[str, set[int]]:
    """Tensor name -> the indices of the nests whose statements read or write it (a pass that
    changes a tile's buffers or accesses may do so only where one nest names it)."""
    nests: dict[str, set[int]] = defaultdict(set)
    for index, nest in enumerate(program.nests):
        for st in nest.statements:
            for access in (*st.inputs, *st.outputs):
                nests[access.tensor].add(index)
    return nests


def writers_and_readers(nest: penguin_pb2.LoopNest) -> tuple[dict[str, list[int]], dict[str, list[int]]]:
    """Per tensor, the indices of the nest's statements that write it, and of those that read it."""
    writers: dict[str, list[int]] = defaultdict(list)
    readers: dict[str, list[int]] = defaultdict(list)
    for k, st in enumerate(nest.statements):
        for access in st.outputs:
            writers[access.tensor].append(k)
        for access in st.inputs:
            readers[access.tensor].append(k)
    return writers, readers


def fills_one_value(st: penguin_pb2.Statement) -> bool:
    """Whether `st` writes one value into every element of its one output: an iota with no step and
    no iota_dimension (an iota along a dimension is an index of the tensor: the rng lowering's
    counters, a mask's row number)."""
    return (st.op == "iota" and not st.inputs and len(st.outputs) == 1 and not any(st.scalars[1:])
            and "iota_dimension" not in st.attributes)


def same_box(a: penguin_pb2.Access, b: penguin_pb2.Access) -> bool:
    """Whether two accesses name the same box (starts and extents alike)."""
    return list(a.starts) == list(b.starts) and list(a.extents) == list(b.extents)
