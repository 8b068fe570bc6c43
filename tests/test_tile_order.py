"""tile_order (a dot's row loop strip-mined below its contraction loop), the loads invariant_loads
then keeps on chip, and the buffer versions bir_codegen gives a block written again in full: on
programs lowered from small HLO dots, and from the CLI with --verify."""

from __future__ import annotations

from pathlib import Path

import pytest
from conftest import run_ncc

from ncc.schemas import bir_pb2, common_pb2, penguin_pb2
from ncc.tools.common import affine
from ncc.tools.common.errors import CompileError
from ncc.tools.common.hbm_traffic import hbm_bytes
from ncc.tools.hlo.hlo_text import parse_hlo_text
from ncc.tools.hlo2penguin.lower import lower_module
from ncc.tools.hlo_opt.bir_codegen import lower_to_bir
from ncc.tools.hlo_opt.optimizer import optimize, parse_pass
from ncc.tools.hlo_opt.passes.invariant_loads import hoist_invariant_loads
from ncc.tools.hlo_opt.passes.pipelining import pipeline_loops
from ncc.tools.hlo_opt.passes.tile_order import order_tiles


def dot(m: int, k: int, n: int, batch: int = 0) -> str:
    b = f"{batch}," if batch else ""
    dims = "lhs_batch_dims={0}, lhs_contracting_dims={2}, rhs_batch_dims={0}, rhs_contracting_dims={1}" \
        if batch else "lhs_contracting_dims={1}, rhs_contracting_dims={0}"
    return (f"HloModule dot\nENTRY main {{\n  x = f32[{b}{m},{k}] parameter(0)\n"
            f"  w = f32[{b}{k},{n}] parameter(1)\n  ROOT d = f32[{b}{m},{n}] dot(x, w), {dims}\n}}\n")


def lowered(text: str) -> penguin_pb2.Program:
    program = lower_module(parse_hlo_text(text))
    optimize(program, ["fusion", "cse", "dce"])
    return program


def loaded_bytes(bir: bir_pb2.Program) -> dict[str, int]:
    """HBM bytes the program's dmas read from the dot's operands x and w."""
    return {name: moved for name, moved in hbm_bytes(bir).items() if name in ("x", "w")}


def matmul_nest(program: penguin_pb2.Program) -> penguin_pb2.LoopNest:
    (nest,) = [n for n in program.nests if any(st.op == "matmul" for st in n.statements)]
    return nest


def test_a_dot_nest_is_strip_mined_below_its_contraction_loop() -> None:
    program = lowered(dot(640, 256, 1024))  # 5 row tiles (R = 4 leaves a partial block), 2 column tiles
    stats = order_tiles(program)
    assert (stats.nests_reordered, stats.row_block, stats.nests_refused) == (1, 4, 0)
    nest = matmul_nest(program)
    assert [(a.name, a.extent) for a in nest.axes][-4:] == [("io", 2), ("j", 2), ("k", 2), ("ii", 4)]
    for st in nest.statements:  # 4·io + ii <= 4: the second block has one row tile
        guard = st.predicates[-1]
        assert guard.relation == penguin_pb2.GE
        assert {(t.var, t.coeff) for t in guard.expr.terms} == {("io", -4), ("ii", -1)}
        assert guard.expr.constant == 4
        for access in [*st.inputs, *st.outputs]:
            assert all(t.var != "i" for start in access.starts for t in start.terms)


def test_a_block_that_divides_the_row_tiles_is_preferred_to_a_guarded_one() -> None:
    """6 row tiles go in blocks of 2 (no guard: a guarded nest's epilogue consumers, which visit
    each tile once, could not join it), where 4 would leave a partial block; 5 tiles, which no
    block of 2 or more divides, keep blocks of 4 and the guard."""
    program = lowered(dot(768, 256, 1024))
    assert order_tiles(program).row_block == 2
    nest = matmul_nest(program)
    assert [(a.name, a.extent) for a in nest.axes][-4:] == [("io", 3), ("j", 2), ("k", 2), ("ii", 2)]
    assert not any(st.predicates and st.predicates[-1].relation == penguin_pb2.GE for st in nest.statements)


def test_every_input_of_a_dot_is_then_read_from_hbm_once() -> None:
    plain = lower_to_bir(lowered(dot(640, 256, 1024)))
    program = lowered(dot(640, 256, 1024))
    order_tiles(program)
    stats = hoist_invariant_loads(program)
    assert stats.loads_kept == 3  # the stationary tile across j; the moving tile across ii and io
    bir = lower_to_bir(program)
    x_bytes, w_bytes = 640 * 256 * 4, 256 * 1024 * 4
    assert loaded_bytes(plain) == {"x": 2 * x_bytes, "w": 5 * w_bytes}
    assert loaded_bytes(bir) == {"x": x_bytes, "w": w_bytes}
    matmuls = [sum(i.op == "matmul" for i in p.instructions) for p in (bir, plain)]
    assert matmuls[0] == matmuls[1]


def test_weights_too_large_to_keep_are_read_once_per_row_block_into_fresh_buffers() -> None:
    program = lowered(dot(1024, 2048, 2048))  # W is 16 MiB: 128 KiB a partition, over the budget
    order_tiles(program)
    hoist_invariant_loads(program)
    nest = matmul_nest(program)
    load_rhs = next(st for st in nest.statements if st.name == "load_rhs")
    assert [[(t.var, t.coeff) for t in p.expr.terms] for p in load_rhs.predicates] == [[("ii", 1)]]
    bir = lower_to_bir(program)
    assert loaded_bytes(bir)["w"] == 2 * 2048 * 2048 * 4  # 8 row tiles in blocks of 4
    # Each row block reloads every weight tile in full: a new version of the block's buffer, so no
    # buffer lives from the first block to the second.
    writes: dict[str, int] = {}
    for instr in bir.instructions:
        for ap in instr.outputs:
            if ap.memory == common_pb2.SBUF:
                writes[ap.tensor] = writes.get(ap.tensor, 0) + 1
    rhs = [name for name in writes if ".rhs[" in name]
    assert len(rhs) == 2 * 16 * 4 and all(writes[name] == 1 for name in rhs)
    assert sum("#1" in name for name in rhs) == 16 * 4
    declared = {b.name for b in bir.buffers}
    assert set(rhs) <= declared


def test_the_row_block_is_bounded_by_the_stationary_tiles_it_keeps() -> None:
    program = lowered(dot(512, 8192, 512))  # 64 stationary tiles of 512 bytes a partition per row tile
    assert order_tiles(program).row_block == 2
    program = lowered(dot(512, 256, 512))
    assert order_tiles(program, max_row_block=1).nests_reordered == 0
    with pytest.raises(CompileError, match="at least 1"):
        parse_pass("tile_order{max_row_block=0}")


def test_a_reordering_that_reverses_a_dependence_is_refused() -> None:
    """A statement reading the result rows the previous row tile stored: the strip-mined order
    would run it before that store, so the nest keeps its order."""
    program = lowered(dot(512, 256, 1024))
    nest = matmul_nest(program)
    store = next(st for st in nest.statements if st.name == "store")
    result = next(t for t in program.tensors if t.name == store.inputs[0].tensor)
    scratch = program.tensors.add()
    scratch.CopyFrom(result)
    scratch.name = "peeked"
    peek = nest.statements.add()
    peek.CopyFrom(store)
    peek.name = "peek"
    del peek.inputs[:], peek.outputs[:]
    peek.inputs.add().CopyFrom(store.outputs[0])
    peek.inputs[0].starts[-2].constant -= 128  # the row tile above
    peek.outputs.add().CopyFrom(store.inputs[0])
    peek.outputs[0].tensor = "peeked"
    del peek.predicates[:]
    peek.predicates.add().CopyFrom(affine.at_least("i", 1))
    stats = order_tiles(program)
    assert (stats.nests_reordered, stats.nests_refused) == (0, 1)
    assert [a.name for a in nest.axes][-3:] == ["i", "j", "k"]


def test_a_block_written_in_part_keeps_its_buffer() -> None:
    """Only a write of every byte starts a new version. K = 200: the moving tile's second k block
    holds 72 of its 128 partitions, so its reloads (one per row tile, nothing kept) rewrite it in
    part and keep its one buffer, while the full first block gets a version per reload."""
    program = lowered(dot(512, 200, 512))
    order_tiles(program)
    bir = lower_to_bir(program)
    names = {ap.tensor for i in bir.instructions for ap in [*i.inputs, *i.outputs] if ".rhs[" in ap.tensor}
    assert names == {"d.rhs[0,0,0]", "d.rhs[0,0,0]#1", "d.rhs[0,0,0]#2", "d.rhs[0,0,0]#3", "d.rhs[0,1,0]"}


@pytest.mark.slow
def test_a_reordered_batched_dot_verifies_from_the_cli(tmp_path: Path) -> None:
    model = tmp_path / "bdot.hlo"
    model.write_text(dot(640, 256, 1024, batch=2))
    moved = {}
    for name, flags in {"ordered": [], "plain": ["--penguin-passes=fusion,cse,dce"]}.items():
        neff = tmp_path / f"{name}.neff"
        compiled = run_ncc("compile", str(model), "--output", str(neff), "--verify", *flags, timeout=300)
        assert compiled.returncode == 0, compiled.stderr
        bir = bir_pb2.Program()
        bir.ParseFromString(next((tmp_path / f"{name}.ncc-work").glob("*_Frontend/bir.pb")).read_bytes())
        moved[name] = loaded_bytes(bir)
    assert moved["ordered"] == {"x": 2 * 640 * 256 * 4, "w": 2 * 256 * 1024 * 4}
    assert moved["plain"] == {"x": 2 * 2 * 640 * 256 * 4, "w": 2 * 5 * 256 * 1024 * 4}
    log = next((tmp_path / "ordered.ncc-work").glob("*_Frontend/stderr.log")).read_text()
    assert "tile_order: nest" in log and "in blocks of 4 row tiles" in log


def test_num_stages_leaves_a_reordered_dot_unpipelined() -> None:
    """Pipelining a loop of a reordered dot would hold several row blocks of accumulators at once
    (E403 in PSUM for gelu(x @ W1) @ W2 at D = 1024 with --num-stages 2): --num-stages skips it,
    while the same nest without tile_order is pipelined."""
    program = lowered(dot(1024, 1024, 1024))
    order_tiles(program)
    nest = matmul_nest(program)
    assert nest.attributes["row_block"] == "4"
    assert pipeline_loops(program, num_stages=2).loops_pipelined == 0
    assert not any("pipelined" in axis.attributes for axis in nest.axes)
    assert pipeline_loops(lowered(dot(1024, 1024, 1024)), num_stages=2).loops_pipelined == 1
