"""Unrolling (tools/hlo_opt/bir_codegen.py) through its compiled affine functions (affine.point_function,
affine.predicate_function): the same values as evaluating the expressions term by term, and an
E301 naming a variable that is not an axis of its nest."""

from __future__ import annotations

import random

import pytest

from ncc.schemas import common_pb2, penguin_pb2
from ncc.tools.common import affine
from ncc.tools.common.errors import CompileError
from ncc.tools.hlo_opt.bir_codegen import lower_to_bir


@pytest.mark.parametrize("seed", range(5))
def test_compiled_expressions_and_predicates_agree_with_evaluating_them(seed: int) -> None:
    rng = random.Random(seed)
    axes = ["i", "j", "k"][: rng.randint(1, 3)]
    exprs = [affine.expr({a: rng.randint(-300, 300) for a in rng.sample(axes, rng.randint(0, len(axes)))},
                         rng.randint(-1000, 1000)) for _ in range(4)]
    predicates = [penguin_pb2.Predicate(expr=e, relation=rng.choice([penguin_pb2.EQ, penguin_pb2.GE]))
                  for e in exprs[:2]]
    starts, holds = affine.point_function(exprs, axes), affine.predicate_function(predicates, axes)
    for _ in range(50):
        point = tuple(rng.randint(0, 20) for _ in axes)
        env = dict(zip(axes, point, strict=True))
        assert starts(point) == [affine.evaluate(e, env) for e in exprs]
        assert holds(point) == all(affine.holds(p, env) for p in predicates)
    assert affine.predicate_function([], axes)(tuple(0 for _ in axes)) is True


def _program(row: penguin_pb2.AffineExpr) -> penguin_pb2.Program:
    """One nest over i loading x[row] into a tile."""
    program = penguin_pb2.Program(name="p")
    program.tensors.add(name="x", dtype=common_pb2.F32, shape=[512, 64], memory=common_pb2.HBM,
                        role=penguin_pb2.INPUT)
    program.tensors.add(name="a", dtype=common_pb2.F32, shape=[512, 64], memory=common_pb2.SBUF,
                        block_shape=[128, 64], role=penguin_pb2.INTERNAL)
    nest = program.nests.add(name="loop")
    nest.axes.add(name="i", extent=4)
    load = nest.statements.add(name="load", op="dma", engine=common_pb2.SP)
    load.outputs.add(tensor="a", starts=[affine.expr({"i": 128}), affine.expr()], extents=[128, 64])
    load.inputs.add(tensor="x", starts=[row, affine.expr()], extents=[128, 64])
    return program


def test_unrolled_starts_follow_the_axes() -> None:
    bir = lower_to_bir(_program(affine.expr({"i": 128})))
    assert [i.inputs[0].offset for i in bir.instructions] == [0, 128 * 64, 256 * 64, 384 * 64]
    assert [i.outputs[0].tensor for i in bir.instructions] == [f"a[{n},0]" for n in range(4)]


def test_a_variable_that_is_no_axis_of_the_nest_is_named() -> None:
    with pytest.raises(CompileError) as err:
        lower_to_bir(_program(affine.expr({"q": 128})))
    assert err.value.code == "E301" and "'q'" in err.value.message and "not an axis" in err.value.message


def test_an_on_chip_tensor_whose_block_has_no_partition_dimension_is_named() -> None:
    """(It was an IndexError traceback.)"""
    program = _program(affine.expr({"i": 128}))
    for tensor in program.tensors:
        if tensor.name == "a":
            del tensor.shape[:]
            tensor.shape.append(512 * 64)
            del tensor.block_shape[:]
            tensor.block_shape.append(128 * 64)
    load = program.nests[0].statements[0]
    del load.outputs[0].starts[1:]
    del load.outputs[0].extents[1:]
    with pytest.raises(CompileError) as err:
        lower_to_bir(program)
    assert err.value.code == "E301" and "'a'" in err.value.message and "1 dimensions" in err.value.message
