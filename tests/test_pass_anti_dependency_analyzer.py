"""anti_dependency_analyzer: FLOW/ANTI/OUTPUT/ORDERED edges per memory class, and its speed."""

from __future__ import annotations

import pytest
from walrus_builders import DVE, PSUM, Bir, by_name, chain_program, hbm_ap, random_program, run_passes, tile

from ncc.schemas import bir_pb2
from ncc.tools.common.errors import CompileError


def edges(program: bir_pb2.Program, passes: str = "anti_dependency_analyzer") -> dict[tuple[str, str], str]:
    ctx = run_passes(program, passes)
    name = {i.id: i.name for i in program.instructions}
    return {(name[a], name[b]): data["kind"] for a, b, data in ctx.deps.edges(data=True)}


def test_chain_has_flow_edges_only():
    found = edges(chain_program(tiles=1))
    assert found == {
        ("load_x0", "add0"): "FLOW",
        ("load_y0", "add0"): "FLOW",
        ("add0", "exp0"): "FLOW",
        ("exp0", "store0"): "FLOW",
    }


def test_war_and_waw_on_one_buffer():
    b = Bir()
    b.hbm("x", [128, 64])
    b.hbm("out", [128, 64], role=bir_pb2.OUTPUT)
    b.buffer("a", 256)
    b.buffer("c", 256)
    b.load("a", "x", 128, 64, name="load")
    b.ts("c", "a", 128, 64, name="read_a")
    b.ts("a", "c", 128, 64, name="overwrite_a")
    b.ts("a", "c", 128, 64, name="overwrite_again")
    b.store("out", "a", 128, 64, name="store")
    found = edges(b.build())
    assert found[("load", "read_a")] == "FLOW"
    assert found[("read_a", "overwrite_a")] == "FLOW"  # also ANTI on a: FLOW (on c) is the stronger kind
    assert found[("load", "overwrite_a")] == "OUTPUT"
    assert found[("overwrite_a", "overwrite_again")] == "OUTPUT"
    assert found[("overwrite_again", "store")] == "FLOW"
    # the covering write retired the earlier accesses: the store depends only on the last writer
    assert ("overwrite_a", "store") not in found and ("load", "store") not in found


def test_pure_anti_edge():
    b = Bir()
    b.hbm("x", [128, 64])
    b.buffer("a", 256)
    b.buffer("c", 256)
    b.load("a", "x", 128, 64, name="load_a")
    b.act("c", "a", 128, 64, name="act_reads_a")
    b.load("a", "x", 128, 64, name="reload_a")
    found = edges(b.build())
    assert found[("act_reads_a", "reload_a")] == "ANTI"
    assert found[("load_a", "reload_a")] == "OUTPUT"


def test_disjoint_partitions_and_bytes_do_not_conflict():
    b = Bir()
    b.buffer("a", 512)
    b.buffer("c", 512)
    b.add(
        "tensor_scalar", DVE, [tile("a", 64, 64)], [tile("c", 64, 64)], name="top", scalars=[1.0], func="add"
    )
    b.add(
        "tensor_scalar",
        DVE,
        [tile("a", 64, 64, partition_start=64)],
        [tile("c", 64, 64)],
        name="bottom",
        scalars=[1.0],
        func="add",
    )
    b.add(
        "tensor_scalar",
        DVE,
        [tile("a", 64, 64, offset=256)],
        [tile("c", 64, 64)],
        name="right",
        scalars=[1.0],
        func="add",
    )
    b.add(
        "tensor_scalar",
        DVE,
        [tile("c", 64, 64, offset=256, partition_start=64)],
        [tile("a", 64, 64, partition_start=64)],
        name="reads_bottom",
        scalars=[1.0],
        func="add",
    )
    found = edges(b.build())
    assert (
        ("top", "bottom") not in found and ("top", "right") not in found and ("bottom", "right") not in found
    )
    assert found == {("bottom", "reads_bottom"): "FLOW"}


def test_hbm_element_ranges():
    b = Bir()
    b.hbm("x", [256, 64])
    b.hbm("scratch", [256, 64], role=bir_pb2.INTERNAL)
    b.buffer("a", 256)
    b.buffer("r0", 256)
    b.buffer("r1", 256)
    b.load("a", "x", 128, 64, name="load")
    b.store("scratch", "a", 128, 64, row0=0, name="spill_rows_0_128")
    b.load("r0", "scratch", 128, 64, row0=0, name="reload_same_rows")
    b.load("r1", "scratch", 128, 64, row0=128, name="load_other_rows")
    found = edges(b.build())
    assert found[("spill_rows_0_128", "reload_same_rows")] == "FLOW"
    assert found[("spill_rows_0_128", "reload_same_rows")] == "FLOW"
    assert ("spill_rows_0_128", "load_other_rows") not in found


def test_column_blocks_of_a_3d_tensor_do_not_wait_for_each_other():
    """[128, 4, 64] written as four [128, 64] blocks (head h: offset 64 h, row stride 256), as
    attention writes its heads side by side: disjoint, so no OUTPUT edges between the stores; the
    tensor is seen in rows of 256, where each block is exact. A read of one block depends on its
    store only, a read of everything on all four."""
    b = Bir()
    b.hbm("heads", [128, 4, 64], role=bir_pb2.INTERNAL)
    b.buffer("t", 256)
    b.buffer("back", 1024)
    for h in range(4):
        block = hbm_ap("heads", 128, 64, row_stride=256)
        block.offset = 64 * h
        b.add("dma", DVE, [block], [tile("t", 128, 64)], name=f"store{h}")
    b.add("dma", DVE, [tile("back", 128, 64)], [hbm_ap("heads", 128, 64, row_stride=256)], name="read0")
    b.add("dma", DVE, [tile("back", 128, 256)], [hbm_ap("heads", 128, 256)], name="read_all")
    found = edges(b.build())
    stores = [f"store{h}" for h in range(4)]
    assert not any((a, c) in found for a in stores for c in stores)
    assert [s for s in stores if (s, "read0") in found] == ["store0"]
    assert all(found[(s, "read_all")] == "FLOW" for s in stores)


def test_stores_in_a_view_the_shape_does_not_offer_do_not_wait_for_each_other():
    """A [2048, 8, 128] KV cache stored as eight [128, 2048] tiles, partition p holding positions
    16 p + 2 j and the one after (row stride 16,384, tile j at offset 2,048 j), the way the LLaMA
    decode step writes its cache: no suffix of the shape (128, 1024) makes a tile a box, so each
    would span every row and the eight stores would wait for one another. Rows of 16,384 (the
    stride the stores walk) make each an exact column block, even though 128 reads of one head
    each are exact only in rows of 1,024: two reads never conflict, writes choose the view."""
    b = Bir()
    b.hbm("cache", [2048, 8, 128], role=bir_pb2.INTERNAL)
    b.buffer("t", 2048 * 4)
    b.buffer("back", 128 * 4)
    for j in range(8):
        block = hbm_ap("cache", 128, 2048, row_stride=16384)
        block.offset = 2048 * j
        b.add("dma", DVE, [block], [tile("t", 128, 2048)], name=f"store{j}")
    for k in range(16):
        for head in range(8):
            rows = hbm_ap("cache", 128, 128, row_stride=1024)
            rows.offset = k * 128 * 1024 + head * 128
            b.add("dma", DVE, [tile("back", 128, 128)], [rows], name=f"read{k}_{head}")
    found = edges(b.build())
    stores = [f"store{j}" for j in range(8)]
    assert not any((a, c) in found for a in stores for c in stores)
    assert all(found[(s, "read0_0")] == "FLOW" for s in stores)  # positions 0-127: every tile


def test_address_mode_sees_conflicts_between_buffers_sharing_bytes():
    b = Bir()
    b.hbm("x", [128, 64])
    b.buffer("a", 256)
    b.buffer("c", 256)
    b.buffer("d", 256)
    b.load("a", "x", 128, 64, name="load_a")
    b.ts("c", "a", 128, 64, name="use_a")
    b.load("d", "x", 128, 64, name="load_d")
    program = b.build()
    assert ("use_a", "load_d") not in edges(program)
    for buffer in program.buffers:  # a and d share bytes; c elsewhere
        buffer.address = {"a": 0, "c": 256, "d": 0}[buffer.name]
    ctx = run_passes(program, "anti_dependency_analyzer")
    assert ctx.allocated and ctx.deps_valid_for_addresses
    name = {i.id: i.name for i in program.instructions}
    found = {(name[a], name[b]): k for a, b, k in ctx.deps.edges(data="kind")}
    assert found[("use_a", "load_d")] == "ANTI"
    assert found[("load_a", "load_d")] == "OUTPUT"


def test_matmul_accumulate_reads_its_output():
    b = Bir()
    b.buffer("s", 256)
    b.buffer("m", 256)
    b.buffer("p", 256, memory=PSUM)
    b.matmul("p", "s", "m", 128, 64, 64, name="mm0")
    b.matmul("p", "s", "m", 128, 64, 64, accumulate=True, name="mm1")
    found = edges(b.build())
    assert found[("mm0", "mm1")] == "FLOW"
    ctx_edges = run_passes(b.build(), "anti_dependency_analyzer").deps.edges(data=True)
    assert all(data["memory"] == "PSUM" for _, _, data in ctx_edges)


def test_order_after_attribute_adds_ordered_edge():
    b = Bir()
    b.buffer("a", 256)
    b.buffer("c", 256)
    b.ts("a", "c", 128, 64, name="first")
    b.add(
        "tensor_scalar",
        DVE,
        [tile("c", 128, 64, offset=0)],
        [tile("c", 128, 64)],
        name="second",
        scalars=[1.0],
        func="add",
        attributes={"order_after": "first"},
    )
    program = b.build()
    by_name(program)["second"].outputs[0].tensor = "c"
    found = edges(program)
    assert found[("first", "second")] == "ANTI"  # the memory conflict is stronger than ORDERED
    b2 = Bir()
    b2.buffer("a", 256)
    b2.buffer("c", 256)
    b2.buffer("d", 256)
    b2.ts("a", "c", 128, 64, name="first")
    b2.add(
        "tensor_scalar",
        DVE,
        [tile("d", 128, 64)],
        [tile("c", 128, 64)],
        name="second",
        scalars=[1.0],
        func="add",
        attributes={"order_after": "first"},
    )
    assert edges(b2.build()) == {("first", "second"): "ORDERED"}


def test_order_after_unknown_name_is_an_error():
    b = Bir()
    b.buffer("a", 256)
    b.ts("a", "a", 128, 64, name="only")
    b.program.instructions[0].attributes["order_after"] = "later"
    with pytest.raises(CompileError) as err:
        run_passes(b.build(), "anti_dependency_analyzer")
    assert err.value.code == "E405"


def test_unknown_buffer_is_an_error():
    b = Bir()
    b.add("dma", 5, [tile("nope", 128, 64)], [hbm_ap("x", 128, 64)], name="bad")
    with pytest.raises(CompileError) as err:
        run_passes(b.build(), "anti_dependency_analyzer", verify_each=False)
    assert err.value.code == "E405" and "nope" in err.value.message


def test_statistics():
    ctx = run_passes(chain_program(tiles=2), "anti_dependency_analyzer")
    stats = ctx.stats["anti_dependency_analyzer"]
    assert stats["edges"] == stats["edges_flow"] == 8 and stats["nodes"] == 10


def test_thousands_of_instructions():
    """Its speed is measured by `make bench-scale`; here, that a large random program is analyzed."""
    program = random_program(7, steps=2500)
    assert len(program.instructions) > 3000
    ctx = run_passes(program, "anti_dependency_analyzer", verify_each=False)
    assert ctx.deps.number_of_edges() > len(program.instructions)


def _graph(ctx) -> set[tuple[int, int, str, str]]:
    return {(a, b, data["kind"], data["memory"]) for a, b, data in ctx.deps.edges(data=True)}


@pytest.mark.parametrize("seed", [3, 11])
def test_the_hbm_walk_in_a_forked_child_gives_the_same_graph(seed: int):
    """From 20k instructions the HBM conflicts are found in a child while SBUF/PSUM are walked
    here; forced either way on a program with HBM round trips, the graphs are identical."""
    in_process = run_passes(random_program(seed, steps=300), "anti_dependency_analyzer{fork=no}")
    in_child = run_passes(random_program(seed, steps=300), "anti_dependency_analyzer{fork=yes}")
    assert in_child.stats["anti_dependency_analyzer"]["forked"] == 1
    assert in_process.stats["anti_dependency_analyzer"]["forked"] == 0
    assert _graph(in_child) == _graph(in_process)
    assert any(memory == "HBM" for *_, memory in _graph(in_child))  # the scratch tensor's round trips


def test_the_run_after_allocation_reuses_the_hbm_edges_and_equals_a_fresh_walk():
    """HBM edges depend neither on addresses nor on a dependence-respecting reorder: the second
    run takes the first run's; a walk from scratch of the scheduled, allocated program agrees."""
    passes = "anti_dependency_analyzer,dep_reduction,pre_sched,allocation,anti_dependency_analyzer"
    ctx = run_passes(random_program(5, steps=300), passes)
    assert ctx.stats["anti_dependency_analyzer#2"]["hbm_edges_reused"] == 1
    assert ctx.stats["anti_dependency_analyzer#2"]["address_mode"] == 1
    reused = _graph(ctx)
    ctx.hbm_edges = None
    fresh = run_passes(ctx.program, "anti_dependency_analyzer")
    assert fresh.stats["anti_dependency_analyzer"]["hbm_edges_reused"] == 0
    assert _graph(fresh) == reused


def test_instructions_that_change_drop_the_kept_hbm_edges():
    ctx = run_passes(random_program(5, steps=60), "anti_dependency_analyzer")
    assert ctx.hbm_edges is not None
    ctx.instructions_changed()
    assert ctx.hbm_edges is None


def test_an_unknown_fork_setting_is_refused():
    with pytest.raises(CompileError) as err:
        run_passes(chain_program(tiles=1), "anti_dependency_analyzer{fork=maybe}")
    assert err.value.code == "E400" and "fork" in err.value.message
