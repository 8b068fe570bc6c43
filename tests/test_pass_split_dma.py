"""split_dma: large DMAs become partition-range pieces that several queues move at once."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
from walrus_builders import HBM, SP, Bir, by_name, chain_program, hbm_ap, reference_chain, run_passes, tile

from ncc.schemas import bir_pb2, penguin_pb2
from ncc.schemas.common_pb2 import F32
from ncc.tools.common.errors import CompileError
from ncc.tools.sim import simulate_program

BACKEND = "anti_dependency_analyzer,pre_sched,allocation,assign_hwdge_engine,anti_dependency_analyzer,"
BACKEND += "alloc_semaphores,semaphore_reset,birverifier,codegen"
MODELS = Path(__file__).resolve().parents[1] / "models"


def test_a_tile_load_is_cut_into_partition_ranges_reading_the_matching_rows() -> None:
    program = chain_program(tiles=1, cols=2048)  # each load: 128 partitions x 8 KiB = 1 MiB
    ctx = run_passes(program, "split_dma")
    assert ctx.stats["split_dma"]["dmas_split"] == 3  # two loads and the store
    pieces = [i for i in program.instructions if i.name.startswith("load_x0/")]
    assert [i.name for i in pieces] == [f"load_x0/part{k}" for k in range(8)]
    for k, piece in enumerate(pieces):
        onchip, hbm = piece.outputs[0], piece.inputs[0]
        assert (onchip.partition_start, onchip.partition_count) == (16 * k, 16)
        assert hbm.offset == 16 * k * 2048 and hbm.dims[0].count == 16
    assert len({i.id for i in program.instructions}) == len(program.instructions)


def test_split_program_computes_the_same_and_spreads_over_queues() -> None:
    rng = np.random.default_rng(3)
    inputs = {
        "arg0": rng.standard_normal((128, 2048)).astype(np.float32),
        "arg1": rng.standard_normal((128, 2048)).astype(np.float32),
    }
    whole = chain_program(tiles=1, cols=2048)
    run_passes(whole, BACKEND)
    pieces = chain_program(tiles=1, cols=2048)
    run_passes(pieces, "split_dma," + BACKEND)
    loads = [i for i in pieces.instructions if i.name.startswith("load_x0/")]
    assert len({i.dma_queue for i in loads}) == len(loads)  # every piece on its own queue
    slow, fast = simulate_program(whole, inputs), simulate_program(pieces, inputs)
    for result in (slow, fast):
        assert not result.races and not result.deadlock
        np.testing.assert_allclose(result.outputs["out0"], reference_chain(inputs), rtol=1e-6)
    assert fast.simulated_ns < slow.simulated_ns / 2


def test_small_dmas_stay_whole() -> None:
    program = chain_program(tiles=2, cols=64)  # 32 KiB per dma: below two pieces of min_bytes
    before = [i.name for i in program.instructions]
    ctx = run_passes(program, "split_dma")
    assert [i.name for i in program.instructions] == before
    assert ctx.stats["split_dma"]["dmas_split"] == 0


def test_a_dma_whose_hbm_side_does_not_walk_the_partitions_stays_whole() -> None:
    b = Bir("flat")
    b.hbm("x", [128 * 2048])
    b.buffer("t", 2048 * 4)
    walk = [bir_pb2.Dim(stride=1, count=128 * 2048)]  # one flat run, not a row per partition
    flat = bir_pb2.AccessPattern(memory=HBM, tensor="x", dtype=F32, dims=walk)
    b.add("dma", SP, [tile("t", 128, 2048)], [flat], name="flat_load")
    program = b.build()
    run_passes(program, "split_dma")
    assert [i.name for i in by_name(program).values()] == ["flat_load"]


def test_must_run_before_queues_are_assigned() -> None:
    with pytest.raises(CompileError) as err:
        run_passes(chain_program(1, 2048), "anti_dependency_analyzer,assign_hwdge_engine,split_dma")
    assert err.value.code == "E402" and "before assign_hwdge_engine" in err.value.message


def test_the_budget_bounds_the_program_split_dma_makes():
    """penguin_budget.backend_instruction_count, computed before unrolling, bounds the instruction
    count after split_dma: exact with the queues' slack rule off, and at least as large with it on
    (the unfused gelu's queues have no slack: without free pieces split_dma cuts only the round
    trips of its intermediates through HBM, and its free pieces cover the rest)."""
    from ncc.tools.common.penguin_budget import backend_instruction_count, instruction_count
    from ncc.tools.hlo.hlo_reader import load_module
    from ncc.tools.hlo.hlo_verify import verify_module
    from ncc.tools.hlo2penguin.lower import lower_module
    from ncc.tools.hlo_opt.bir_codegen import lower_to_bir

    module = load_module(str(MODELS / "gelu.hlo.pb"))
    verify_module(module)
    penguin = lower_module(module)
    backend, _, _ = backend_instruction_count(penguin)
    counts = {}
    for options in ("{free_extra=-1}", "", "{free_extra=0}"):
        bir = lower_to_bir(penguin)
        assert instruction_count(penguin)[0] == len(bir.instructions)
        counts[options] = len(run_passes(bir, f"split_dma{options}").program.instructions)
    unrolled = instruction_count(penguin)[0]
    assert backend == counts["{free_extra=-1}"] == counts[""] > counts["{free_extra=0}"] > unrolled


def test_after_max_extra_pieces_later_dmas_stay_whole() -> None:
    program = chain_program(tiles=4, cols=2048)  # 12 dmas of 1 MiB, 8 pieces each by size
    ctx = run_passes(program, "split_dma{max_extra=10,fit_first_wave=0}")
    pieces = {}
    for instr in program.instructions:
        if instr.op == "dma":
            base = instr.name.split("/")[0]
            pieces[base] = pieces.get(base, 0) + 1
    counts = list(pieces.values())  # in program order
    assert counts[0] == 8 and sum(counts) - len(counts) == 10  # 7 + 3 extra, then whole
    assert counts[1] == 4 and set(counts[2:]) == {1}
    assert ctx.stats["split_dma"]["kept_whole"] == len(counts) - 1


def _wide_add_bir() -> tuple[penguin_pb2.Program, bir_pb2.Program]:
    """f32[153600, 2048] + f32[153600, 2048]: 3,600 tile dmas of 1 MiB, 8 pieces each by size."""
    from ncc.tools.hlo.hlo_text import parse_hlo_text
    from ncc.tools.hlo2penguin.lower import lower_module
    from ncc.tools.hlo_opt.bir_codegen import lower_to_bir

    rows = 128 * 1200
    penguin = lower_module(parse_hlo_text(
        f"HloModule wide\nENTRY e {{\n  a = f32[{rows},2048] parameter(0)\n"
        f"  b = f32[{rows},2048] parameter(1)\n  ROOT s = f32[{rows},2048] add(a, b)\n}}\n"))
    return penguin, lower_to_bir(penguin)


def test_the_budget_counts_the_extra_pieces_split_dma_spends() -> None:
    """The size rule would cut each of the 3,600 dmas in 8 (25,200 extra pieces); without the
    slack rule split_dma spends DMA_SPLIT_MAX_EXTRA of them, and the budget counts exactly that."""
    from ncc.tools.common.penguin_budget import backend_instruction_count
    from ncc.tools.target import DMA_SPLIT_MAX_EXTRA

    penguin, bir = _wide_add_bir()
    dmas, unrolled = sum(instr.op == "dma" for instr in bir.instructions), len(bir.instructions)
    backend, _, _ = backend_instruction_count(penguin)
    ctx = run_passes(bir, "split_dma{free_extra=-1}")
    assert dmas == 3600
    assert backend == len(ctx.program.instructions) == unrolled + DMA_SPLIT_MAX_EXTRA


def test_where_the_queues_are_the_bound_only_the_free_pieces_are_cut() -> None:
    """The add moves 7.5 GB for 0.3 ms of DVE work: its queues have no slack, so split_dma cuts
    DMA_SPLIT_FREE_EXTRA pieces (the first dmas') and keeps the rest whole."""
    from ncc.tools.target import DMA_SPLIT_FREE_EXTRA

    _, bir = _wide_add_bir()
    unrolled = len(bir.instructions)
    ctx = run_passes(bir, "split_dma")
    assert len(ctx.program.instructions) == unrolled + DMA_SPLIT_FREE_EXTRA
    first = [i.name for i in ctx.program.instructions[:8]]
    assert all("/part" in name for name in first)  # the program's start keeps its pieces
    assert not any("/part" in i.name for i in ctx.program.instructions[-100:])


def test_where_an_engine_is_the_bound_every_dma_keeps_its_pieces() -> None:
    """Two 1 MiB loads, then a chain of 64 exps on ACT: ACT's work leaves the queues slack for
    every piece the size rule cuts, whatever the free pieces."""
    b = Bir("act_bound")
    cols = 2048
    b.hbm("x", [128, cols], index=0)
    b.hbm("y", [128, cols], index=1)
    b.hbm("out", [128, cols], role=bir_pb2.OUTPUT, index=0)
    for name in ("x", "y", "s", "e"):
        b.buffer(name, cols * 4)
    b.load("x", "x", 128, cols, name="load_x")
    b.load("y", "y", 128, cols, name="load_y")
    b.tt("s", "x", "y", 128, cols, name="add")
    for k in range(64):
        b.act("e" if k % 2 == 0 else "s", "s" if k % 2 == 0 else "e", 128, cols, name=f"exp{k}")
    b.store("out", "s", 128, cols, name="store")
    program = b.build()
    ctx = run_passes(program, "split_dma{free_extra=0,fit_first_wave=0}")
    assert ctx.stats["split_dma"]["kept_whole"] == 0
    assert sum(i.op == "dma" for i in program.instructions) == 3 * 8


def _round_trip_program() -> bir_pb2.Program:
    """Sixteen 1 MiB input tiles copied to an output through SBUF (the queues are the bound), and
    the sum of the first two stored to an internal HBM tensor, read back, exp'd and stored."""
    b = Bir("round_trip")
    tiles, cols = 16, 2048
    b.hbm("x", [128 * tiles, cols], index=0)
    b.hbm("tmp", [128, cols], role=bir_pb2.INTERNAL)
    b.hbm("copy", [128 * tiles, cols], role=bir_pb2.OUTPUT, index=0)
    b.hbm("out", [128, cols], role=bir_pb2.OUTPUT, index=1)
    for name in [f"x{k}" for k in range(tiles)] + ["s", "r", "e"]:
        b.buffer(name, cols * 4)
    for k in range(tiles):
        b.load(f"x{k}", "x", 128, cols, row0=128 * k, name=f"load_x{k}")
        b.store("copy", f"x{k}", 128, cols, row0=128 * k, name=f"store_copy{k}")
    b.tt("s", "x0", "x1", 128, cols, name="add")
    b.store("tmp", "s", 128, cols, name="store_tmp")
    b.load("r", "tmp", 128, cols, name="load_tmp")
    b.act("e", "r", 128, cols, name="exp")
    b.store("out", "e", 128, cols, name="store_out")
    return b.build()


def test_values_that_go_through_hbm_are_cut_even_where_the_queues_have_no_slack() -> None:
    """A store and load of a value the program computes stand between its producer and its
    reader, on the critical path: the slack rule keeps the input loads and the output store whole,
    but cuts these two (a CLIP text encoder ran 638 us with them whole, 375 cut)."""
    rng = np.random.default_rng(5)
    inputs = {"arg0": rng.standard_normal((128 * 16, 2048)).astype(np.float32)}
    expected = np.exp(inputs["arg0"][:128] + inputs["arg0"][128:256])
    whole = _round_trip_program()
    run_passes(whole, BACKEND)
    program = _round_trip_program()
    ctx = run_passes(program, "split_dma{free_extra=0,fit_first_wave=0}," + BACKEND)
    names = [i.name for i in program.instructions if i.op == "dma"]
    assert sum(name.startswith("store_tmp/") for name in names) == 8
    assert sum(name.startswith("load_tmp/") for name in names) == 8
    assert "store_out" in names and "load_x3" in names  # the slack rule kept these whole
    assert ctx.stats["split_dma"]["kept_whole"] == 33
    slow, fast = simulate_program(whole, inputs), simulate_program(program, inputs)
    for result in (slow, fast):
        assert not result.races and not result.deadlock
        np.testing.assert_array_equal(result.outputs["out0"], inputs["arg0"])
        np.testing.assert_allclose(result.outputs["out1"], expected, rtol=1e-5)
    assert fast.simulated_ns < slow.simulated_ns


def _matmul_bir() -> bir_pb2.Program:
    """The bundled matmul f32[128,256] x f32[256,512] lowered to BIR: two k-steps, each loading
    a 64 KiB lhsT and a 256 KiB rhs tile (2 + 8 pieces by the size rule: 20 for 16 queues)."""
    from ncc.tools.hlo.hlo_reader import load_module
    from ncc.tools.hlo2penguin.lower import lower_module
    from ncc.tools.hlo_opt.bir_codegen import lower_to_bir

    return lower_to_bir(lower_module(load_module(str(MODELS / "matmul.hlo.pb"))))


def test_the_loads_one_accumulation_needs_fill_the_queues_once() -> None:
    program = _matmul_bir()
    ctx = run_passes(program, "split_dma")
    assert ctx.stats["split_dma"]["first_wave_rebalanced"] == 4
    loads = [i for i in program.instructions if "/load_" in i.name]
    assert len(loads) == 16  # one piece per queue, in proportion to bytes: 2 x (6 + 2)
    rhs_pieces = [i for i in loads if "load_rhs" in i.name]
    assert len(rhs_pieces) == 12


def test_fitting_the_first_wave_is_faster_and_computes_the_same() -> None:
    with np.load(MODELS / "matmul.io.npz") as data:
        inputs = {k: data[k] for k in data.files if k.startswith("arg")}
        expected = data["out0"]
    times = {}
    for fit in ("true", "false"):
        program = _matmul_bir()
        run_passes(program, f"split_dma{{fit_first_wave={fit}}}," + BACKEND)
        result = simulate_program(program, inputs)
        assert not result.races and not result.deadlock
        np.testing.assert_allclose(result.outputs["out0"], expected, rtol=1e-5, atol=1e-5)
        times[fit] = result.simulated_ns
    assert times["true"] < 0.95 * times["false"]  # 6.4 against 6.9 us when measured


def test_loads_that_feed_different_results_keep_the_size_rule() -> None:
    """Two independent tile chains: ending every load together would delay the first result."""
    program = chain_program(tiles=2, cols=2048)  # 4 loads x 8 pieces, feeding two results
    ctx = run_passes(program, "split_dma")
    assert ctx.stats["split_dma"]["first_wave_rebalanced"] == 0
    assert sum(1 for i in program.instructions if i.name.startswith("load_")) == 32


def test_a_row_broadcast_to_the_partitions_is_read_once_and_spread_on_chip_in_pieces() -> None:
    """layernorm's gamma and beta ([768], broadcast to [128, 768] tiles): HBM gives one row, an
    on-chip dma copies it to the 128 partitions, and split_dma cuts that copy like a load."""
    from ncc.tools.hlo.hlo_reader import load_module
    from ncc.tools.hlo2penguin.lower import lower_module
    from ncc.tools.hlo_opt.bir_codegen import lower_to_bir

    program = lower_to_bir(lower_module(load_module(str(MODELS / "layernorm.hlo.pb"))))
    loads = [i for i in program.instructions if i.op == "dma" and i.inputs[0].memory == HBM]
    assert all(i.inputs[0].dims[0].stride != 0 for i in loads)  # no HBM row is read 128 times
    spreads = [i for i in program.instructions if i.name.endswith(".broadcast")]
    assert spreads and all(
        (i.inputs[0].partition_count, i.inputs[0].dims[0].stride, i.outputs[0].partition_count)
        == (1, 0, i.inputs[0].dims[0].count)
        for i in spreads
    )
    ctx = run_passes(program, "split_dma," + BACKEND)
    pieces = [i for i in program.instructions if ".broadcast/part" in i.name]
    assert len(pieces) > len(spreads) and ctx.stats["split_dma"]["dmas_split"] > 0
    with np.load(MODELS / "layernorm.io.npz") as data:
        inputs = {k: data[k] for k in data.files if k.startswith("arg")}
        expected = data["out0"]
    result = simulate_program(program, inputs)
    assert not result.races and not result.deadlock
    np.testing.assert_allclose(result.outputs["out0"], expected, rtol=1e-5, atol=1e-5)


def test_an_hbm_to_hbm_copy_is_cut_in_rows_on_both_sides_and_computes_the_same() -> None:
    """A direct copy (hlo_opt's direct_copies: HBM to HBM, no tile between) of 128 rows x 8 KiB is
    cut like a tile load: each piece takes the same rows of both sides, on its own queue."""
    def copy_program() -> bir_pb2.Program:
        b = Bir("hbm_copy")
        b.hbm("x", [256, 2048], index=0)
        b.hbm("out", [128, 2048], role=bir_pb2.OUTPUT, index=0)
        b.add("dma", SP, [hbm_ap("out", 128, 2048)], [hbm_ap("x", 128, 2048, row0=128)], name="copy")
        return b.build()

    pieces = copy_program()
    ctx = run_passes(pieces, "split_dma," + BACKEND)
    assert ctx.stats["split_dma"]["dmas_split"] == 1
    parts = [i for i in pieces.instructions if i.name.startswith("copy/")]
    assert len(parts) == 8 and len({i.dma_queue for i in parts}) == 8
    for k, piece in enumerate(parts):
        source, target = piece.inputs[0], piece.outputs[0]
        assert (source.offset, source.dims[0].count) == ((128 + 16 * k) * 2048, 16)
        assert (target.offset, target.dims[0].count) == (16 * k * 2048, 16)
    whole = copy_program()
    run_passes(whole, BACKEND)
    x = np.random.default_rng(5).standard_normal((256, 2048)).astype(np.float32)
    slow, fast = simulate_program(whole, {"arg0": x}), simulate_program(pieces, {"arg0": x})
    for result in (slow, fast):
        assert not result.races and not result.deadlock
        np.testing.assert_array_equal(result.outputs["out0"], x[128:])
    assert fast.simulated_ns < slow.simulated_ns / 2
