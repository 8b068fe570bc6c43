"""Software pipelining (tools/hlo_opt/pipelining.py): requests and their validation, the realization
(extended bounds, stage guards, the index shift), buffer counts and widening, the ISL legality check
on hand-built Penguin loops; then the JAX fixture annotated through set_xla_metadata, end to end."""

from __future__ import annotations

import json
from collections import Counter
from pathlib import Path

import numpy as np
import pytest
from conftest import run_ncc

from ncc.schemas import bir_pb2, common_pb2, hlo_pb2, penguin_pb2
from ncc.tools.common import affine
from ncc.tools.common.errors import CompileError
from ncc.tools.hlo.hlo_text import parse_hlo_text
from ncc.tools.hlo2penguin.lower import lower_module
from ncc.tools.hlo_opt.bir_codegen import lower_to_bir
from ncc.tools.hlo_opt.optimizer import optimize, pass_list
from ncc.tools.hlo_opt.passes.pipelining import buffer_counts, pipeline_loops, plan_nest

DATA = Path(__file__).parent / "data"
ACT, DVE, SP = common_pb2.ACT, common_pb2.DVE, common_pb2.SP


# -- hand-built loops ---------------------------------------------------------------------------


def tile(name: str, rows: int, memory: int = common_pb2.SBUF) -> penguin_pb2.TensorDecl:
    return penguin_pb2.TensorDecl(name=name, dtype=common_pb2.F32, shape=[rows, 64], memory=memory,
                                  block_shape=[128, 64], role=penguin_pb2.INTERNAL)


def box(tensor: str, row: dict[str, int] | None = None, constant: int = 0) -> penguin_pb2.Access:
    """A [128, 64] box whose row start is the affine `row` (default 128·i)."""
    start = affine.expr({"i": 128} if row is None else row, constant)
    return penguin_pb2.Access(tensor=tensor, starts=[start, affine.expr()], extents=[128, 64])


def statement(name: str, op: str, out: penguin_pb2.Access, *ins: penguin_pb2.Access, engine: int = DVE,
              **attributes: str) -> penguin_pb2.Statement:
    st = penguin_pb2.Statement(name=name, op=op, engine=engine, func="tanh" if op == "activation" else "add")
    st.outputs.append(out)
    st.inputs.extend(ins)
    for key, value in attributes.items():
        st.attributes[key] = value
    return st


def elementwise(iterations: int = 16, **nest_attributes: str) -> penguin_pb2.Program:
    """load a ← x[i]; b = tanh(a); c = b + a; store y[i] ← c: one nest over `iterations` row tiles."""
    rows = 128 * iterations
    program = penguin_pb2.Program(name="p")
    program.tensors.add(name="x", dtype=common_pb2.F32, shape=[rows, 64], memory=common_pb2.HBM,
                        role=penguin_pb2.INPUT)
    program.tensors.add(name="y", dtype=common_pb2.F32, shape=[rows, 64], memory=common_pb2.HBM,
                        role=penguin_pb2.OUTPUT)
    program.tensors.extend([tile("a", rows), tile("b", rows), tile("c", rows)])
    nest = program.nests.add(name="loop")
    nest.axes.add(name="i", extent=iterations)
    nest.axes.add(name="j", extent=1)
    nest.statements.extend([
        statement("load", "dma", box("a"), box("x"), engine=SP),
        statement("tanh", "activation", box("b"), box("a"), engine=ACT),
        statement("add", "tensor_tensor", box("c"), box("b"), box("a")),
        statement("store", "dma", box("y"), box("c"), engine=SP),
    ])
    for key, value in nest_attributes.items():
        nest.attributes[key] = value
    return program


def accumulating(iterations: int = 8) -> penguin_pb2.Program:
    """t = s · x[i]; s = t + x[i]: a running value s carried from each iteration to the next."""
    program = elementwise(iterations)
    program.tensors.append(tile("s", 128))
    program.tensors.append(tile("t", 128 * iterations))
    nest = program.nests[0]
    del nest.statements[:]
    nest.statements.extend([
        statement("load", "dma", box("a"), box("x"), engine=SP),
        statement("scale", "tensor_tensor", box("t"), box("s", {}), box("a")),
        statement("update", "tensor_tensor", box("s", {}), box("t"), box("a")),
        statement("store", "dma", box("y"), box("s", {}), engine=SP),
    ])
    return program


def predicates(st: penguin_pb2.Statement) -> list[tuple[str, int]]:
    return [(affine.to_text(p.expr), p.relation) for p in st.predicates]


# -- the realization ----------------------------------------------------------------------------


def test_mode_a_extends_the_loop_guards_each_stage_and_shifts_its_iteration(capsys) -> None:
    program = elementwise(16, num_stages="3")
    stats = pipeline_loops(program)
    assert (stats.loops_pipelined, stats.loops_skipped) == (1, 0)
    (nest,) = program.nests
    assert nest.axes[0].extent == 16 + 3 - 1 and nest.axes[0].attributes["pipelined"] == "3"
    assert nest.axes[1].extent == 1  # only the pipelined loop changes
    # four statements cut in program order into three contiguous groups
    assert [(st.name, st.attributes["stage"]) for st in nest.statements] == \
        [("load", "0"), ("tanh", "0"), ("add", "1"), ("store", "2")]
    ge = penguin_pb2.GE
    load, _, add, store = nest.statements
    assert predicates(load) == [("i", ge), ("-1*i + 15", ge)]  # i >= 0, i < 16
    assert predicates(add) == [("i + -1", ge), ("-1*i + 16", ge)]  # i >= 1, i < 17
    assert predicates(store) == [("i + -2", ge), ("-1*i + 17", ge)]  # i >= 2, i < 18
    # stage s reads iteration i - s: its starts are shifted by s tiles
    assert affine.to_text(load.outputs[0].starts[0]) == "128*i"
    assert [affine.to_text(a.starts[0]) for a in [*add.outputs, *add.inputs]] == ["128*i + -128"] * 3
    assert [affine.to_text(a.starts[0]) for a in [*store.outputs, *store.inputs]] == ["128*i + -256"] * 2
    log = capsys.readouterr().err
    assert "Chosen number of pipeline stages: 3" in log and "loop i bounds [0, 16) -> [0, 18)" in log


def test_every_original_instance_runs_once_at_its_stage_shift() -> None:
    """Unrolled, the pipelined loop does exactly the unpipelined loop's work (same operands), with
    iteration k's stage-s statement at loop counter k + s."""
    plain, piped = elementwise(5), elementwise(5, num_stages="3")
    pipeline_loops(piped, widen=False)
    before, after = lower_to_bir(plain), lower_to_bir(piped)

    def work(bir: bir_pb2.Program) -> Counter:
        return Counter((i.op, *(a.SerializeToString(deterministic=True) for a in [*i.outputs, *i.inputs]))
                       for i in bir.instructions)

    assert work(before) == work(after) and len(after.instructions) == 4 * 5
    order = [i.name.split("/")[1] for i in after.instructions]
    assert order[:4] == ["load[i0,j0]", "tanh[i0,j0]", "load[i1,j0]", "tanh[i1,j0]"]
    assert order[4:8] == ["add[i1,j0]", "load[i2,j0]", "tanh[i2,j0]", "add[i2,j0]"]  # add of iteration 1
    assert order[-1] == "store[i6,j0]"  # iteration 4's store at loop counter 4 + 2
    assert {i.attributes["stage"] for i in after.instructions} == {"0", "1", "2"}


def test_a_matmul_accumulating_over_the_pipelined_loop_starts_its_group_at_its_own_iteration() -> None:
    program = elementwise(4)
    program.tensors.append(tile("p", 128, common_pb2.PSUM))
    nest = program.nests[0]
    mm = statement("mm", "matmul", box("p", {}), box("a"), box("a"), engine=common_pb2.PE,
                   accumulate_axis="i", stage_id="1")
    del nest.statements[1:]
    nest.statements[0].attributes["stage_id"] = "0"
    nest.statements.extend([mm, statement("copy", "tensor_copy", box("c", {}), box("p", {}), stage_id="1")])
    nest.statements[-1].predicates.append(affine.equals("i", 3))
    pipeline_loops(program)
    bir = lower_to_bir(program)
    flags = [(i.name.split("/")[1], i.accumulate) for i in bir.instructions if i.op == "matmul"]
    assert flags == [("mm[i1,j0]", False), ("mm[i2,j0]", True), ("mm[i3,j0]", True), ("mm[i4,j0]", True)]


# -- buffers ------------------------------------------------------------------------------------


def test_buffer_count_is_max_use_stage_minus_min_def_stage_plus_one() -> None:
    program = elementwise(8)
    program.tensors.append(tile("unused", 1024))
    program.tensors.append(tile("shared", 1024))
    program.tensors.append(tile("acc", 1024, common_pb2.PSUM))
    nest = program.nests[0]
    for st, stage in zip(nest.statements, ["0", "1", "3", "3"], strict=True):
        st.attributes["stage"] = stage
    nest.statements.add(name="dead", op="iota", outputs=[box("unused")], attributes={"stage": "0"})
    nest.statements.add(name="fill", op="iota", outputs=[box("shared")], attributes={"stage": "0"})
    nest.statements.add(name="use", op="tensor_copy", outputs=[box("acc")], inputs=[box("shared")],
                        attributes={"stage": "2"})
    nest.statements.add(name="read", op="tensor_copy", outputs=[box("c")], inputs=[box("acc")],
                        attributes={"stage": "3"})
    program.tensors.append(tile("z", 1024))
    other = program.nests.add(name="other")  # another nest reads `shared`: not local to the loop
    other.statements.add(name="o", op="tensor_copy", outputs=[box("z")], inputs=[box("shared")])
    counts = buffer_counts(program, nest)
    # a: def 0, uses 1 and 3 -> 4; b: def 1, use 3 -> 3; c: defs 3 (and 3), use 3 -> 1. No def or
    # no use (unused, x, y), another nest's tile (shared) and PSUM (acc) are not counted.
    assert counts == {"a": 4, "b": 3, "c": 1}


def test_widening_multiplies_the_block_along_the_pipelined_axis() -> None:
    program = elementwise(16, num_stages="3")
    pipeline_loops(program)
    blocks = {t.name: list(t.block_shape) for t in program.tensors if t.memory == common_pb2.SBUF}
    # a: def 0, last use 1 -> 2 iterations; b: def 0, use 1 -> 2; c: def 1, use 2 -> 2
    assert blocks == {"a": [256, 64], "b": [256, 64], "c": [256, 64]}
    unwidened = elementwise(16, num_stages="3")
    pipeline_loops(unwidened, widen=False)
    assert all(list(t.block_shape) == [128, 64] for t in unwidened.tensors if t.memory == common_pb2.SBUF)


def test_a_block_widened_along_partitions_is_one_buffer_per_iteration_in_bir() -> None:
    program = elementwise(4, num_stages="3")
    pipeline_loops(program)
    bir = lower_to_bir(program)
    buffers = {b.name: (b.partitions, b.bytes_per_partition) for b in bir.buffers}
    assert buffers["a[0,0]/0"] == buffers["a[0,0]/1"] == buffers["a[1,0]/0"] == (128, 64 * 4)
    assert "a[1,0]/1" in buffers and len([n for n in buffers if n.startswith("a[")]) == 4


def test_a_block_widened_along_the_free_dimension_holds_the_iterations_side_by_side() -> None:
    program = elementwise(1)
    program.nests[0].axes[0].extent, program.nests[0].axes[1].extent = 1, 6
    for t in program.tensors:
        t.shape[:] = [128, 64 * 6]
    for st in program.nests[0].statements:
        for access in [*st.inputs, *st.outputs]:
            access.starts[0].CopyFrom(affine.expr())
            access.starts[1].CopyFrom(affine.expr({"j": 64}))
    program.nests[0].attributes["num_stages"] = "2"
    pipeline_loops(program)
    assert [t.block_shape[-1] for t in program.tensors if t.name in "abc"] == [128, 128, 64]
    bir = lower_to_bir(program)
    a_tiles = [(i.outputs[0].tensor, i.outputs[0].offset) for i in bir.instructions if i.name.split("/")[1]
               .startswith("load")]
    assert a_tiles == [("a[0,0]", 0), ("a[0,0]", 256), ("a[0,1]", 0), ("a[0,1]", 256), ("a[0,2]", 0),
                       ("a[0,2]", 256)]


def test_widening_is_never_combined_with_an_explicit_multi_buffer() -> None:
    program = elementwise(16, num_stages="3")
    program.tensors[2].num_buffers = 2  # a
    with pytest.raises(CompileError) as info:
        pipeline_loops(program)
    assert info.value.code == "E303" and "num_buffers=2" in info.value.message
    program = elementwise(16, num_stages="3")
    program.tensors[2].num_buffers = 2
    assert pipeline_loops(program, widen=False).loops_pipelined == 1


# -- requests and their validation --------------------------------------------------------------


def mode_b(*stages: int | None, orders: tuple[int | None, ...] = ()) -> penguin_pb2.Program:
    program = elementwise(16)
    for k, st in enumerate(program.nests[0].statements):
        if stages[k] is not None:
            st.attributes["stage_id"] = str(stages[k])
        if k < len(orders) and orders[k] is not None:
            st.attributes["execution_order"] = str(orders[k])
    return program


def refusal(program: penguin_pb2.Program, **options) -> str:
    with pytest.raises(CompileError) as info:
        pipeline_loops(program, **options)
    assert info.value.code in ("E303", "E304")
    return info.value.message


@pytest.mark.parametrize("stages, orders, message", [
    ((0, 2, 2, 3), (), "Stage ids must be consecutive starting from 0, got [0, 2, 3]"),
    ((1, 1, 2, 2), (), "Stage ids must be consecutive starting from 0, got [1, 2]"),
    ((0, 1, 0, 1), (), "Stage ids must be monotonically increasing in program order: 'add' (stage 0) "
                       "follows 'tanh' (stage 1)"),
    ((0, 0, None, 1), (), "stage_id must be on every statement of the loop body or on none: 'add' has none"),
    ((0, 0, 1, 1), (0, 1), "Execution orders must be all absent or all present: stage 1 has none"),
    ((0, 0, 1, 1), (0, 1, 2), "Execution order missing in ordered stage 1: 'store' has none"),
    ((0, 0, 1, 1), (0, 1, 2, 4), "Execution orders must be consecutive starting from 0, got [0, 1, 2, 4]"),
    ((0, 0, 1, 1), (0, 1, 2, 2), "Execution orders must be consecutive starting from 0, got [0, 1, 2, 2]"),
    ((0, 0, 1, 1), (1, 0, 2, 3), "Execution orders must increase within a stage: 'tanh' (order 0) follows "
                                 "'load' (order 1) in stage 0"),
])
def test_mode_b_validation(stages, orders, message) -> None:
    assert refusal(mode_b(*stages, orders=orders)) == message


def test_an_option_skips_the_execution_order_check() -> None:
    program = mode_b(0, 1, 1, 2, orders=(0, 2, 5, 1))  # not consecutive
    assert refusal(program) == "Execution orders must be consecutive starting from 0, got [0, 1, 2, 5]"
    program = mode_b(0, 1, 1, 2, orders=(0, 2, 5, 1))
    assert pipeline_loops(program, check_order=False).loops_pipelined == 1
    assert [st.name for st in program.nests[0].statements] == ["load", "store", "tanh", "add"]


def test_mode_b_groups_by_stage_and_interleaves_by_execution_order() -> None:
    program = mode_b(0, 1, 1, 2)
    pipeline_loops(program)
    nest = program.nests[0]
    assert [(st.name, st.attributes["stage"]) for st in nest.statements] == \
        [("load", "0"), ("tanh", "1"), ("add", "1"), ("store", "2")]
    assert nest.axes[0].extent == 18
    program = mode_b(0, 1, 1, 2, orders=(1, 2, 3, 0))  # the store of iteration i-2 first
    pipeline_loops(program)
    assert [st.name for st in program.nests[0].statements] == ["store", "load", "tanh", "add"]


def test_both_modes_at_once_are_refused() -> None:
    program = mode_b(0, 0, 1, 1)
    program.nests[0].attributes["num_stages"] = "2"
    assert refusal(program) == "Cannot use both num_stages attribute and stage_id annotations simultaneously"
    program = mode_b(0, 0, 1, 1)
    program.nests[0].axes[0].attributes["num_stages"] = "2"
    assert refusal(program) == "Cannot use both num_stages attribute and stage_id annotations simultaneously"


def test_nested_pipelining_is_not_supported() -> None:
    program = elementwise(16)
    program.nests[0].axes[0].attributes["num_stages"] = "2"
    program.nests[0].axes[1].attributes["num_stages"] = "2"
    assert refusal(program) == "Nested pipelining is not supported: nest 'loop' would pipeline loops i and j"
    program = elementwise(16, num_stages="2")
    pipeline_loops(program)
    program.nests[0].axes[1].attributes["num_stages"] = "2"  # the inner loop of a pipelined one
    assert refusal(program).startswith("Nested pipelining is not supported")
    assert pipeline_loops(program := elementwise(16, num_stages="2")).loops_pipelined == 1
    assert pipeline_loops(program).loops_pipelined == 0  # already pipelined: left as it is


def test_malformed_mode_a_requests() -> None:
    assert refusal(elementwise(16, num_stages="x")) == "num_stages must be a positive integer, got 'x'"
    assert refusal(elementwise(16, num_stages="0")) == "num_stages must be a positive integer, got '0'"
    assert "more than the 4 statements" in refusal(elementwise(16, num_stages="5"))
    assert plan_nest(elementwise(16, num_stages="1").nests[0]) is None  # one stage: nothing to do
    assert plan_nest(elementwise(1, num_stages="3").nests[0]) is None  # one iteration: no loop


def test_the_axis_attribute_picks_the_loop() -> None:
    program = elementwise(16)
    program.nests[0].axes[0].attributes["num_stages"] = "2"
    pipeline_loops(program)
    assert program.nests[0].axes[0].extent == 17


# -- legality -----------------------------------------------------------------------------------


def test_a_schedule_that_reverses_a_dependence_is_refused_naming_it() -> None:
    """scale reads s before update writes it; cut between them, iteration i+1's scale (stage 0)
    would run before iteration i's update (stage 1) at the same loop counter in program order, and
    interleaved, iteration i−1's store (stage 2) after iteration i's update: every body is refused,
    with the dependence program order reverses."""
    program = accumulating()
    program.nests[0].attributes["num_stages"] = "3"
    message = refusal(program)
    assert message.startswith("3-stage pipelining of loop i of nest 'loop' violates the RAW dependence "
                              "update (stage 1) -> scale (stage 0) on 's': {")
    assert "update[i, j = 0] -> scale[i' = 1 + i, j' = 0]" in message  # the relation, in axis names
    assert message.endswith("first violated instance update[i=0, j=0] -> scale[i=1, j=0]")


def test_a_loop_carried_dependence_within_one_stage_is_legal() -> None:
    program = accumulating()
    for st, stage in zip(program.nests[0].statements, (0, 1, 1, 1), strict=True):
        st.attributes["stage_id"] = str(stage)
    assert pipeline_loops(program).loops_pipelined == 1
    program = accumulating()  # the store of s one stage later: the next update overwrites it first
    for st, stage in zip(program.nests[0].statements, (0, 1, 1, 2), strict=True):
        st.attributes["stage_id"] = str(stage)
    assert "violates the WAR dependence store (stage 2) -> update (stage 1) on 's'" in refusal(program)


def test_mode_a_interleaves_the_stages_when_that_keeps_a_dependence_program_order_reverses() -> None:
    """At 2 stages program order would run iteration i+1's scale before iteration i's update;
    interleaved, the body is load(i), update(i−1), scale(i), store(i−1), which keeps it."""
    program = accumulating()
    program.nests[0].attributes["num_stages"] = "2"
    assert pipeline_loops(program).loops_pipelined == 1
    assert [(st.name, st.attributes["stage"]) for st in program.nests[0].statements] == \
        [("load", "0"), ("update", "1"), ("scale", "0"), ("store", "1")]


def alternating(iterations: int = 16, chain: int = 6) -> penguin_pb2.Program:
    """load; `chain` ops alternating ACT (tanh) and DVE (add), each reading the one before; store."""
    program = elementwise(iterations)
    rows = 128 * iterations
    names = [f"t{k}" for k in range(chain)]
    program.tensors.extend(tile(name, rows) for name in names)
    nest = program.nests[0]
    del nest.statements[:]
    nest.statements.append(statement("load", "dma", box("a"), box("x"), engine=SP))
    previous = "a"
    for k, name in enumerate(names):
        if k % 2 == 0:
            nest.statements.append(statement(name, "activation", box(name), box(previous), engine=ACT))
        else:
            nest.statements.append(statement(name, "tensor_tensor", box(name), box(previous), box(previous)))
        previous = name
    nest.statements.append(statement("store", "dma", box("y"), box(previous), engine=SP))
    return program


def test_mode_a_interleaves_an_engine_alternating_chain_and_groups_a_one_engine_chain() -> None:
    """Without the backend's scheduler each engine runs the body in order: an ACT/DVE chain keeps
    both busy only when iterations interleave; a chain on DVE alone gains nothing from it, and
    program order is kept."""
    program = alternating()
    program.nests[0].attributes["num_stages"] = "3"
    pipeline_loops(program)
    stages = [(st.name, st.attributes["stage"]) for st in program.nests[0].statements]
    assert stages[:4] == [("load", "0"), ("t2", "1"), ("t5", "2"), ("t0", "0")]
    assert sorted(stages) == sorted([("load", "0"), ("t0", "0"), ("t1", "0"), ("t2", "1"), ("t3", "1"),
                                     ("t4", "1"), ("t5", "2"), ("store", "2")])
    program = alternating()
    for st in program.nests[0].statements:
        if st.engine == ACT:
            st.op, st.engine, st.func = "tensor_tensor", DVE, "add"
            st.inputs.append(st.inputs[0])
    program.nests[0].attributes["num_stages"] = "3"
    pipeline_loops(program)
    assert [st.name for st in program.nests[0].statements] == ["load", "t0", "t1", "t2", "t3", "t4", "t5",
                                                                "store"]


def test_an_execution_order_that_reverses_a_dependence_is_refused() -> None:
    program = mode_b(0, 1, 1, 2, orders=(0, 2, 1, 3))  # add (reads b) before tanh writes b
    assert "Execution orders must increase within a stage" in refusal(program)
    program = mode_b(0, 1, 1, 2, orders=(0, 2, 1, 3))
    assert "violates the RAW dependence tanh (stage 1) -> add (stage 1) on 'b'" in \
        refusal(program, check_order=False)


def test_the_command_line_default_skips_loops_it_would_make_wrong(capsys) -> None:
    program = accumulating()
    program.nests.append(elementwise(16).nests[0])
    program.nests[1].name = "fine"
    stats = pipeline_loops(program, num_stages=3)
    assert (stats.loops_pipelined, stats.loops_skipped) == (1, 1)
    assert program.nests[0].axes[0].extent == 8 and program.nests[1].axes[0].extent == 18
    assert "nest 'loop' left unpipelined (--num-stages)" in capsys.readouterr().err
    assert pipeline_loops(elementwise(16), num_stages=5).loops_pipelined == 0  # more stages than statements


def test_hbm_accesses_through_views_alias_their_base() -> None:
    """The store writes y through a view, the next iteration's load reads y directly: a real RAW
    dependence between iterations that only the base tensor's addresses reveal."""
    program = elementwise(8)
    program.tensors.add(name="y.v", dtype=common_pb2.F32, shape=[1024, 64], memory=common_pb2.HBM,
                        role=penguin_pb2.INTERNAL, view_of="y", view_offset=64, view_strides=[64, 1])
    nest = program.nests[0]
    nest.statements[3].outputs[0].tensor = "y.v"  # store y.v[i] = y rows i·128 + 1 ...
    nest.statements[0].inputs[0].tensor = "y"  # load y[i]: reads row (i+1)·128 - 127, stored at i
    nest.attributes["num_stages"] = "3"
    assert "violates the RAW dependence store (stage 2) -> load (stage 0) on 'y.v'" in refusal(program)


# -- where requests come from -------------------------------------------------------------------

ANNOTATED = """HloModule a
ENTRY main {
  x = f32[1024,64] parameter(0)
  t = f32[1024,64] tanh(x), frontend_attributes={ncc_num_stages="2"}
  c = f32[] constant(0.5)
  h = f32[1024,64] broadcast(c), dimensions={}
  ROOT m = f32[1024,64] multiply(t, h), frontend_attributes={ncc_num_stages="2"}
}
"""


def test_the_hlo_frontend_attribute_survives_fusion_and_asks_for_mode_a() -> None:
    program = lower_module(parse_hlo_text(ANNOTATED))
    optimize(program, pass_list("", 2))
    (nest,) = program.nests
    assert nest.attributes["frontend:ncc_num_stages"] == "2"
    assert nest.axes[0].attributes["pipelined"] == "2" and nest.axes[0].extent == 8 + 1


def test_pass_list_options_and_the_command_line_default() -> None:
    assert pass_list("", 2)[-6:] == [
        "pipeline", "invariant_loads", "forward", "direct_copies", "act_operands", "dce"]
    assert pass_list("", 0) == []
    assert pass_list("pipeline{widen=0,check_order=false},dce", 0) == \
        ["pipeline{widen=0,check_order=false}", "dce"]
    for bad in ("pipeline{bogus=1}", "pipeline{widen=maybe}", "fusion{widen=1}", "pipelin"):
        with pytest.raises(CompileError) as info:
            pass_list(bad, 2)
        assert info.value.code == "E400"
    plain = ANNOTATED.replace(', frontend_attributes={ncc_num_stages="2"}', "")
    program = lower_module(parse_hlo_text(plain))
    optimize(program, ["fusion", "pipeline"], num_stages=3)
    assert program.nests[0].axes[0].extent == 8 + 2
    program = lower_module(parse_hlo_text(ANNOTATED))
    optimize(program, ["fusion", "pipeline{num_stages=3}"], num_stages=4)  # the annotation wins
    assert program.nests[0].axes[0].extent == 8 + 1


def test_a_penguin_file_given_to_the_optimizer_carries_its_own_request(tmp_path: Path) -> None:
    import subprocess
    import sys

    program = mode_b(0, 1, 1, 2)
    (tmp_path / "p.pb").write_bytes(program.SerializeToString())
    done = subprocess.run([sys.executable, "-m", "ncc.tools.hlo_opt", "--input", str(tmp_path / "p.pb"),
                           "--output", str(tmp_path / "b.pb"), "--penguin-passes", "pipeline{widen=0}"],
                          capture_output=True, text=True, timeout=60)
    assert done.returncode == 0, done.stderr
    assert "Chosen number of pipeline stages: 3" in done.stderr
    bir = bir_pb2.Program()
    bir.ParseFromString((tmp_path / "b.pb").read_bytes())
    assert [i.attributes["stage"] for i in bir.instructions[:8]] == ["0", "0", "1", "1", "0", "1", "1", "2"]


def test_num_stages_reaches_the_frontend_job_and_its_cache_key(tmp_path: Path) -> None:
    from ncc.orchestrator.options import CompileOptions
    from ncc.orchestrator.pipeline.stages import Frontend

    options = CompileOptions(model=tmp_path / "m.hlo", output=tmp_path / "m.neff", workdir=tmp_path / "w",
                             num_stages=3)
    assert CompileOptions.from_json(options.to_json()) == options
    assert "--num-stages=3" in options.canonical_flags()
    assert Frontend.standalone(workdir=str(tmp_path), model="m", pipeline=[], compile_flags=[],
                               num_stages=3).flags() == ["--num-stages", "3", "--optlevel", "2"]
    assert Frontend.standalone(workdir=str(tmp_path), model="m", pipeline=[], compile_flags=[]).flags() == \
        ["--optlevel", "2"]


def test_an_annotated_dot_whose_schedule_reloads_a_live_tile_is_refused_from_the_cli(tmp_path: Path) -> None:
    """In three stages the lhsT tile, loaded again at every column tile j into the same block, would be
    overwritten (stage 0, j + 1) before the matmul of j (stage 1) reads it."""
    model = tmp_path / "dot.hlo"
    model.write_text("""HloModule d
ENTRY main {
  x = f32[128,256] parameter(0)
  w = f32[256,1024] parameter(1)
  ROOT d = f32[128,1024] dot(x, w), lhs_contracting_dims={1}, rhs_contracting_dims={0}, \
frontend_attributes={ncc_num_stages="3"}
}
""")
    compiled = run_ncc("compile", str(model), "--output", str(tmp_path / "d.neff"), timeout=120)
    assert compiled.returncode == 1, compiled.stderr
    assert "[E304] job Frontend: 3-stage pipelining of loop j of nest 'd_2' violates the WAR dependence " \
           "matmul (stage 1) -> load_lhsT (stage 0) on 'd.lhsT'" in compiled.stderr
    assert "first violated instance matmul[b=0, i=0, j=0, k=0] -> load_lhsT[b=0, i=0, j=1, k=0]" in \
        compiled.stderr


# -- the JAX fixture, end to end ----------------------------------------------------------------


def unannotated(path: Path, into: Path) -> Path:
    module = hlo_pb2.HloModuleProto()
    module.ParseFromString(path.read_bytes())
    for computation in module.computations:
        for instr in computation.instructions:
            instr.ClearField("frontend_attributes")
    into.write_bytes(module.SerializeToString())
    return into


@pytest.mark.slow
@pytest.mark.parametrize("optlevel", [0, 2])
def test_the_annotated_jax_model_pipelines_matches_jax_race_free_and_runs_faster(tmp_path: Path,
                                                                                  optlevel: int) -> None:
    model = DATA / "pipelined_chain.hlo.pb"
    io = DATA / "pipelined_chain.io.npz"
    assert b"ncc_num_stages" in model.read_bytes()
    timings = {}
    for name, path in (("annotated", model), ("plain", unannotated(model, tmp_path / "plain.hlo.pb"))):
        neff = tmp_path / f"{name}.neff"
        # -O0 runs no Penguin pass by default: name them, for both models alike
        compiled = run_ncc("compile", str(path), "--output", str(neff), "--optlevel", str(optlevel),
                           "--verify", "--penguin-passes=fusion,cse,dce,pipeline", timeout=300)
        assert compiled.returncode == 0, compiled.stderr
        log = next((tmp_path / f"{name}.ncc-work").glob("*_Frontend/stderr.log")).read_text()
        assert ("Chosen number of pipeline stages: 3" in log) == (name == "annotated")
        report = tmp_path / f"{name}.json"
        ran = run_ncc("run", str(neff), "--inputs", str(io), "--output", str(tmp_path / f"{name}.npz"),
                      "--report", str(report), timeout=300)
        assert ran.returncode == 0, ran.stderr  # a race or a deadlock would fail the run (R001, R002)
        with np.load(io) as want, np.load(tmp_path / f"{name}.npz") as got:
            np.testing.assert_allclose(got["out0"], want["out0"], rtol=1e-5, atol=1e-6)
        timings[name] = float(json.loads(report.read_text())["simulated_ns"])
    if optlevel == 0:  # the program order is the schedule: the interleaved body overlaps the
        # ACT/DVE chain of three iterations (13.8 -> 9.1 us; 11.0 with the stages grouped)
        assert timings["annotated"] * 1.4 < timings["plain"], timings
    else:  # pre_sched overlaps the plain loop's iterations as well (the same schedule today)
        assert timings["annotated"] <= timings["plain"], timings
