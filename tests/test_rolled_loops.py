"""Loops that stay loops from Penguin to the NEFF (`--loops rolled|auto`): the Frontend's steady
ranges, peeled iterations and private tensors (hlo_opt/rolling.py, bir_codegen), walrus's view of
a static program with loops (loopnest, loop_deps, loop_sync, allocation's rotating copies,
codegen's loop streams), and end to end: rolled NEFFs that match the golden evaluator and the
unrolled compile bit for bit, a planted dropped rotation wait that the simulator reports, a
program too large to unroll that compiles rolled."""

from __future__ import annotations

import re

import hlo_gen
import numpy as np
import pytest
from orchestrator_support import assert_one_line_error, find_model, ncc

from ncc.schemas import bir_pb2, common_pb2, penguin_pb2
from ncc.tools.common import affine, loops
from ncc.tools.common.errors import CompileError
from ncc.tools.hlo.hlo_reader import parse_module_text
from ncc.tools.hlo2penguin.lower import lower_module
from ncc.tools.hlo_opt import rolling
from ncc.tools.hlo_opt.bir_codegen import SMALL_NEST, BirCodeGenLoop, lower_to_bir
from ncc.tools.hlo_opt.optimizer import optimize, pass_list
from ncc.tools.packager.neff import build_neff
from ncc.tools.sim.api import simulate_neff
from ncc.tools.walrus_driver.__main__ import compile_program
from ncc.tools.walrus_driver.analysis import loopnest
from ncc.tools.walrus_driver.pass_manager import default_pipeline

ADD = """HloModule add
ENTRY main {
  x = f32[ROWS,COLS] parameter(0)
  y = f32[ROWS,COLS] parameter(1)
  ROOT s = f32[ROWS,COLS] add(x, y)
}
"""


def _bir(text: str, loops_mode: str = "rolled", optlevel: int = 2, passes: str = "",
         small_nest: int = 0) -> bir_pb2.Program:
    """`text` lowered to BIR; every nest a loop fits keeps it (small_nest=0), unless told otherwise."""
    program = lower_module(parse_module_text(text.encode()))
    optimize(program, pass_list(passes, optlevel), num_stages=0)
    return lower_to_bir(program, loops=loops_mode, small_nest=small_nest)


def _entries(program: bir_pb2.Program) -> list[bir_pb2.Instruction]:
    return [i for i in program.instructions if i.op == loops.LOOP_OP]


# ---- the Frontend ---------------------------------------------------------------------------


def test_an_elementwise_nest_is_a_loop_with_moving_hbm_offsets_and_private_tiles():
    program = _bir(ADD.replace("ROWS", "1024").replace("COLS", "512"))
    (entry,) = _entries(program)
    assert entry.trip_count == 8  # 8 row tiles of 128, none peeled
    body = [i for i in program.instructions if i.HasField("in_loop")]
    assert len(body) == entry.body_length == 4  # two loads, the add, the store
    loads = [i for i in body if i.op == "dma" and i.inputs[0].memory == common_pb2.HBM]
    assert all([v.step for v in i.inputs[0].loop] == [128 * 512] for i in loads)  # a row tile per iteration
    onchip = {ap.tensor for i in body for ap in (*i.inputs, *i.outputs) if ap.memory != common_pb2.HBM}
    buffers = {b.name: b for b in program.buffers}
    assert onchip and all(buffers[name].private_to == entry.id for name in onchip)


def test_a_partial_last_tile_is_peeled_after_the_loop():
    program = _bir(ADD.replace("ROWS", "1000").replace("COLS", "512"))  # 7 full row tiles and 104 rows
    (entry,) = _entries(program)
    assert entry.trip_count == 7
    after = program.instructions[list(program.instructions).index(entry) + 1 + entry.body_length:]
    assert after and all(not i.HasField("in_loop") for i in after)
    assert any(ap.partition_count == 1000 - 7 * 128 for i in after for ap in i.outputs)


def test_a_small_nest_unrolls_in_every_mode():
    """8 row tiles of an add are 32 instructions unrolled (bir_codegen.SMALL_NEST): no loop, even
    under --loops rolled; 64 tiles, 256 instructions, keep theirs."""
    assert not _entries(_bir(ADD.replace("ROWS", "1024").replace("COLS", "512"), small_nest=SMALL_NEST))
    (entry,) = _entries(_bir(ADD.replace("ROWS", "8192").replace("COLS", "512"), small_nest=SMALL_NEST))
    assert entry.trip_count == 64


SLICE = """HloModule c
ENTRY main {
  x = f32[ROWS,512] parameter(0)
  ROOT t = f32[HALF,512] slice(x), slice={[0:ROWS:2], [0:512]}
}
"""


def test_a_nest_of_transfers_alone_unrolls_up_to_four_times_the_small_nest():
    """A strided slice is a nest of dmas alone, bound by its queues: 192 transfers unroll (at
    most 4 x SMALL_NEST), 768 keep their loop; an add of as many instructions keeps its loop."""
    def slice_of(rows: int) -> str:
        return SLICE.replace("ROWS", str(rows)).replace("HALF", str(rows // 2))

    assert not _entries(_bir(slice_of(49152), small_nest=SMALL_NEST))
    assert _entries(_bir(slice_of(49152)))  # small_nest=0: every nest a loop fits keeps it
    (entry,) = _entries(_bir(slice_of(196608), small_nest=SMALL_NEST))
    assert entry.trip_count == 384
    assert _entries(_bir(ADD.replace("ROWS", "12288").replace("COLS", "512"), small_nest=SMALL_NEST))


def test_small_nests_unroll_only_while_the_program_stays_within_the_cap(monkeypatch):
    """The 256 instructions of 64 add tiles unroll as a small nest of up to 300, unless the program
    would then pass AUTO_SHALLOW_TOTAL (a program of many small nests stays rolled)."""
    from ncc.tools.hlo_opt import bir_codegen

    text = ADD.replace("ROWS", "8192").replace("COLS", "512")
    assert not _entries(_bir(text, small_nest=300))
    monkeypatch.setattr(bir_codegen, "AUTO_SHALLOW_TOTAL", 200)
    assert _entries(_bir(text, small_nest=300))


def test_unrolled_mode_keeps_no_loop_and_auto_rolls_only_a_large_program():
    small = ADD.replace("ROWS", "1024").replace("COLS", "512")
    assert not _entries(_bir(small, "unrolled"))
    assert not _entries(_bir(small, "auto"))  # 32 instructions: cheaper unrolled
    assert _entries(_bir(ADD.replace("ROWS", "262144").replace("COLS", "4096"), "auto"))


def _nest(extent_k: int, predicates: list[penguin_pb2.Predicate]) -> tuple[penguin_pb2.LoopNest, dict]:
    """A nest over (i, k) that loads an SBUF tile per (i, k) of x and stores it to y under
    `predicates`."""
    x, y = (penguin_pb2.TensorDecl(name=name, dtype=common_pb2.F32, shape=[512, 128 * extent_k],
                                   memory=common_pb2.HBM) for name in "xy")
    t = penguin_pb2.TensorDecl(name="t", dtype=common_pb2.F32, shape=[512, 128], memory=common_pb2.SBUF,
                               block_shape=[128, 128])
    nest = penguin_pb2.LoopNest(name="n", axes=[penguin_pb2.Axis(name="i", extent=4),
                                               penguin_pb2.Axis(name="k", extent=extent_k)])
    box = [affine.expr({"i": 128}), affine.expr({"k": 128})]
    load = nest.statements.add(name="load", op="dma", engine=common_pb2.SP)
    load.outputs.add(tensor="t", starts=[affine.expr({"i": 128}), affine.expr()], extents=[128, 128])
    load.inputs.add(tensor="x", starts=box, extents=[128, 128])
    store = nest.statements.add(name="store", op="dma", engine=common_pb2.SP, predicates=predicates)
    store.outputs.add(tensor="y", starts=box, extents=[128, 128])
    store.inputs.add(tensor="t", starts=[affine.expr({"i": 128}), affine.expr()], extents=[128, 128])
    return nest, {"x": x, "y": y, "t": t}


def test_steady_ranges_peel_the_iterations_where_a_predicate_changes():
    nest, tensors = _nest(6, [affine.at_least("k", 1), penguin_pb2.Predicate(
        expr=affine.expr({"k": 1}, -4), relation=penguin_pb2.GE)])
    plan = rolling.plan_rolling(nest, tensors, set(), min_trip=2)
    assert plan is not None
    by_axis = {a.name: (a.lo, a.hi) for a in plan.axes}
    assert by_axis["i"] == (0, 4)  # t moves a whole block per i: private to i's loop
    assert plan.private == {"t": {"i", "k"}}  # loaded afresh at every (i, k)
    assert by_axis["k"] == (4, 6)  # k >= 1 switches at 1, k >= 4 at 4: the steady run doing most


def test_a_tensor_another_nest_reads_keeps_its_axis_unrolled():
    nest, tensors = _nest(2, [])
    plan = rolling.plan_rolling(nest, tensors, {"t"}, min_trip=2)
    assert plan is not None and [a.name for a in plan.axes] == ["k"]  # i would make t private


# ---- walrus over a static program -----------------------------------------------------------


def test_loop_entries_come_out_while_the_passes_run_and_go_back_after():
    program = _bir(ADD.replace("ROWS", "1024").replace("COLS", "512"))
    before = [(i.name, i.op) for i in program.instructions]
    entries = loopnest.extract(program)
    assert len(entries) == 1 and all(i.op != loops.LOOP_OP for i in program.instructions)
    loopnest.restore(program.instructions, entries)
    assert [(i.name, i.op) for i in program.instructions] == before


def test_a_body_split_by_a_reorder_is_refused():
    program = _bir(ADD.replace("ROWS", "1024").replace("COLS", "512"))
    entries = loopnest.extract(program)
    program.instructions.add(id=999, name="outside", op="nop", engine=common_pb2.SP)  # top level
    order = list(program.instructions)
    order.insert(2, order.pop())  # ... now standing inside the body
    with pytest.raises(CompileError, match="E405"):
        loopnest.LoopNest.of(entries, order)


@pytest.mark.parametrize("optlevel", [0, 2])
def test_private_tiles_rotate_and_the_rolled_neff_matches_the_unrolled_one(optlevel):
    text = ADD.replace("ROWS", "1024").replace("COLS", "1024")
    neffs = {}
    for mode in ("rolled", "unrolled"):
        program = _bir(text, mode)
        compile_program(program, default_pipeline(optlevel))
        neffs[mode] = build_neff(program)
    buffers = {b.name: b for b in _bir(text).buffers}
    assert buffers
    rolled_streams = [s for s in neffs["rolled"].streams
                      if any(i.op == loops.LOOP_OP for i in s.instructions)]
    assert rolled_streams
    rotations = [v.rotation for s in rolled_streams for i in s.instructions for ap in i.outputs
                 for v in ap.loop]
    assert any(len(r) == 2 for r in rotations)  # double buffering: copy r mod 2
    rng = np.random.default_rng(0)
    inputs = {f"arg{k}": rng.standard_normal((1024, 1024)).astype(np.float32) for k in range(2)}
    results = {mode: simulate_neff(neff, inputs) for mode, neff in neffs.items()}
    for result in results.values():
        assert not result.races and result.deadlock is None
    np.testing.assert_array_equal(results["rolled"].outputs["out0"], results["unrolled"].outputs["out0"])
    np.testing.assert_array_equal(results["rolled"].outputs["out0"], inputs["arg0"] + inputs["arg1"])
    executed = sum(loops.check_stream(s, "E603") for s in neffs["rolled"].streams)
    static = sum(len(s.instructions) for s in neffs["rolled"].streams)
    assert static < executed


def test_split_dma_spends_its_piece_budget_on_the_dmas_run_most():
    """With room for one dma's pieces, the pieces go to a dma of the loop (run 16 times), not to
    the first dma in program order (the peeled first iteration's, run once): GPT-2's budget ran
    out before its LM head, whose weight tiles then moved whole on two queues (44.9 -> 32.1 ms)."""
    text = DOT.replace("512,1024", "8704,256").replace("1024,1536", "256,512").replace("512,1536", "8704,512")
    program = _bir(text)
    compile_program(program, ["split_dma{max_extra=3}"])
    pieces = [i for i in program.instructions if i.op == "dma" and "/part" in i.name]
    assert pieces and all(i.HasField("in_loop") for i in pieces)
    top_level = [i for i in program.instructions if i.op == "dma" and not i.HasField("in_loop")]
    assert top_level and not any("/part" in i.name for i in top_level)


# ---- end to end -----------------------------------------------------------------------------


@pytest.mark.slow
@pytest.mark.parametrize("model, optlevel", [("block", 0), ("block", 2), ("mlp", 3), ("layernorm", 1),
                                             ("cnn_train", 2), ("decoder_step", 2)])
def test_models_compile_rolled_and_match(tmp_path, model, optlevel):
    path = find_model(f"{model}.hlo.pb")
    result = ncc("compile", path, "--loops", "rolled", "--optlevel", str(optlevel), "--verify",
                 "-o", tmp_path / "m.neff", "--workdir", tmp_path / "w")
    assert result.returncode == 0, result.stderr
    io = path.with_name(f"{model}.io.npz")
    run = ncc("run", tmp_path / "m.neff", "--inputs", io, "--output", tmp_path / "o.npz")
    assert run.returncode == 0, run.stderr
    assert "max |error|" in run.stdout


@pytest.mark.slow
def test_num_stages_over_rolled_loops(tmp_path):
    path = find_model("gelu.hlo.pb")
    for stages in ("2", "3"):
        result = ncc("compile", path, "--loops", "rolled", "--num-stages", stages, "--verify",
                     "-o", tmp_path / f"g{stages}.neff", "--workdir", tmp_path / f"w{stages}")
        assert result.returncode == 0, result.stderr


def _pipelined_chain(rows: int, jam: int = 0) -> bir_pb2.Program:
    """hlo_gen's six-op chain on f32[rows, 64], its row-tile loop pipelined in 3 stages, lowered rolled."""
    program = lower_module(parse_module_text(hlo_gen.chain(6, rows=rows, cols=64).encode()))
    optimize(program, pass_list("", 2), num_stages=3)
    return BirCodeGenLoop(program, "trn1", "rolled", jam=jam).run()


def test_a_pipelined_loop_stays_a_loop_whose_widened_tiles_are_rings_of_slabs():
    """1,024 row tiles in 3 stages: the 1,026 iterations of the pipelined axis are one loop between 2
    peeled ones at each end (where a stage's guard is off), and each tile pipelining widened to
    two iterations is a ring with one slab per iteration the body holds (rolling.py, Rings)."""
    bir = _pipelined_chain(1024 * 128)
    (entry,) = _entries(bir)
    body = [i for i in bir.instructions if i.HasField("in_loop") and i.in_loop == entry.id]
    copies = len({re.search(r"\[i\*(\+\d+)?,", i.name).group(0) for i in body})
    assert copies >= 2 and entry.trip_count == 1024 // copies
    stages = [int(i.attributes["stage"]) for i in bir.instructions if "stage" in i.attributes]
    assert len(stages) == 8 * (1024 - entry.trip_count * copies) + 8 * copies  # the rest peeled
    rings: dict[str, set[str]] = {}
    for instr in bir.instructions:
        for ap in [*instr.inputs, *instr.outputs]:
            if "[~," in ap.tensor:
                name, slab = ap.tensor.split("#")[0].split("/")
                rings.setdefault(name, set()).add(slab)
    assert len(rings) == 2 and all(slabs == {str(k) for k in range(copies)} for slabs in rings.values())
    assert _pipelined_chain(1024 * 128, jam=1) == bir  # fewer copies than a ring's slabs: the plan's


def test_a_small_pipelined_loop_unrolls_its_stages():
    """16 row tiles: unrolled, the stages run faster than as a loop (bir_codegen's
    PIPELINED_UNROLL_MAX), so the pipelined axis keeps no loop."""
    bir = _pipelined_chain(16 * 128)
    assert not _entries(bir)
    assert {i.attributes["stage"] for i in bir.instructions if "stage" in i.attributes} == {"0", "1", "2"}


@pytest.mark.slow
def test_a_rolled_pipelined_loop_matches_and_runs_race_free(tmp_path):
    model = tmp_path / "chain.hlo"
    model.write_text(hlo_gen.chain(6, rows=1024 * 128, cols=64))
    result = ncc("compile", model, "--loops", "rolled", "--num-stages", "3", "--verify",
                 "-o", tmp_path / "c.neff", "--workdir", tmp_path / "w")
    assert result.returncode == 0, result.stderr
    x = np.random.default_rng(0).standard_normal((1024 * 128, 64)).astype(np.float32)
    np.savez(tmp_path / "in.npz", arg0=x)
    run = ncc("run", tmp_path / "c.neff", "--inputs", tmp_path / "in.npz", "--output", tmp_path / "o.npz",
              "--inferences", "2")
    assert run.returncode == 0, run.stderr  # a race or a deadlock is an R-coded error
    x3 = np.tanh(x * np.float32(0.5) + x)
    with np.load(tmp_path / "o.npz") as out:
        np.testing.assert_allclose(out["out0"], np.tanh(x3 * np.float32(0.5) + x3), rtol=1e-5, atol=1e-6)


FAULT = {"NCC_FAULT_INJECT": "walrus_driver:drop_rotation_wait@pass=codegen"}


@pytest.mark.slow
def test_a_dropped_rotation_wait_of_a_frontend_loop_is_a_race_between_iterations(tmp_path):
    model = tmp_path / "add.hlo"
    model.write_text(ADD.replace("ROWS", "8192").replace("COLS", "512"))  # 64 tiles: more than a small nest
    ones = np.ones((8192, 512), np.float32)
    np.savez(tmp_path / "in.npz", arg0=ones, arg1=ones)
    workdir = tmp_path / "wd"
    result = ncc("compile", model, "--loops", "rolled", "-o", tmp_path / "bad.neff", "--workdir", workdir,
                 env=FAULT)
    assert result.returncode == 0, result.stderr
    log = next(workdir.glob("*_WalrusDriver/stderr.log")).read_text()
    assert "drop_rotation_wait: dropped rotation wait" in log
    run = ncc("run", tmp_path / "bad.neff", "--inputs", tmp_path / "in.npz", "--output", tmp_path / "o.npz")
    line = assert_one_line_error(run, "R001")
    assert len(re.findall(r"'([^']+@\d+)' \((\w+)\)", line)) == 2, line  # both, with their iterations


def test_a_program_too_large_to_unroll_compiles_rolled(tmp_path):
    model = tmp_path / "huge.hlo"  # 800M elements: 2.3M instructions unrolled, refused so (test_fuzz_cli)
    model.write_text("HloModule huge\nENTRY main {\n  x = f32[100000000,8] parameter(0)\n"
                     "  ROOT e = f32[100000000,8] exponential(x)\n}\n")
    rolled = ncc("compile", model, "-o", tmp_path / "r.neff", "--workdir", tmp_path / "r")
    assert rolled.returncode == 0, rolled.stderr
    inspect = ncc("inspect", tmp_path / "r.neff")
    static, executed = re.search(r"([\d,]+) instructions \(([\d,]+) executed\)", inspect.stdout).groups()
    assert int(executed.replace(",", "")) > 2_000_000 > 10_000 * int(static.replace(",", ""))


def test_the_chain_of_the_scale_family_rolls_with_copies_per_body():
    program = _bir(hlo_gen.hlo_text("chain", n=30, rows=1024, cols=512), "rolled")
    names = [i.name for i in program.instructions if i.HasField("in_loop")]
    assert any("*+1" in name for name in names)  # the body holds two iterations (unroll and jam)


def test_roll_loops_rolls_the_runs_inside_a_frontend_loop_body_exactly():
    """The chain's loop body holds two iterations of 300 ops: straight runs that repeat with a
    period of three ops (multiply, add, tanh). roll_loops rolls them inside the Frontend's loop,
    keeping that loop's variations outermost; the streams execute what codegen wrote, instance
    for instance, and run alike."""
    text = hlo_gen.hlo_text("chain", n=300, rows=1024, cols=512)
    programs = {}
    for label, passes in (("kept", [p for p in default_pipeline(2) if p != "roll_loops"]),
                          ("rolled", default_pipeline(2))):
        programs[label] = _bir(text)
        ctx, _ = compile_program(programs[label], passes)
    stats = ctx.stats["roll_loops"]
    addresses = {b.name: b.address for b in programs["kept"].buffers}
    addresses.update({b.name: b.address for b in programs["rolled"].buffers})
    expanded = {label: {s.engine: s.instructions for s in loops.expand_streams(p.streams, "E603", 10**7)}
                for label, p in programs.items()}
    assert sorted(expanded["kept"]) == sorted(expanded["rolled"])
    for engine, want in expanded["kept"].items():
        got = expanded["rolled"][engine]
        assert len(got) == len(want)
        for a, b in zip(got, want, strict=True):
            assert loops.canonical(a, addresses) == loops.canonical(b, addresses), (engine, a.name)
    static = {label: sum(len(s.instructions) for s in p.streams) for label, p in programs.items()}
    executed = sum(len(s) for s in expanded["kept"].values())
    assert stats["dynamic_instructions"] == executed and stats["static_instructions"] == static["rolled"]
    assert static["rolled"] < 0.25 * static["kept"] and stats["loop_depth"] == 2
    rng = np.random.default_rng(0)
    inputs = {"arg0": rng.standard_normal((1024, 512)).astype(np.float32)}
    runs = {label: simulate_neff(build_neff(p), inputs) for label, p in programs.items()}
    assert not runs["rolled"].races and runs["rolled"].deadlock is None
    assert runs["rolled"].simulated_ns == runs["kept"].simulated_ns
    np.testing.assert_array_equal(runs["rolled"].outputs["out0"], runs["kept"].outputs["out0"])


def test_a_loop_follows_the_loop_before_it_iteration_by_iteration():
    """Two nests over the same rows (no fusion at -O0): the second loop's iteration r waits for
    the first's iteration r alone (an aligned dependence), not for the whole first loop; the
    result is the unrolled one's."""
    text = """HloModule two
ENTRY main {
  x = f32[2048,512] parameter(0)
  e = f32[2048,512] exponential(x)
  ROOT t = f32[2048,512] tanh(e)
}
"""
    neffs, stats = {}, {}
    for mode in ("rolled", "unrolled"):
        program = _bir(text, mode, optlevel=0)
        ctx, manager = compile_program(program, default_pipeline(0))
        stats[mode] = manager.report(ctx)["passes"]
        neffs[mode] = build_neff(program)
    analyses = [p["stats"] for p in stats["rolled"] if p["name"] == "anti_dependency_analyzer"]
    assert analyses[-1]["loops_aligned"] >= 1
    x = np.random.default_rng(1).standard_normal((2048, 512)).astype(np.float32)
    results = {mode: simulate_neff(neff, {"arg0": x}) for mode, neff in neffs.items()}
    assert not results["rolled"].races and results["rolled"].deadlock is None
    np.testing.assert_array_equal(results["rolled"].outputs["out0"], results["unrolled"].outputs["out0"])


@pytest.mark.slow
def test_rolled_attention_keeps_off_recently_freed_bytes_and_runs_near_the_unrolled_one():
    """Attention at seq 2048, d 512. Where allocation gave the softmax body's tiles bytes an
    earlier tile of the same body had just freed, each iteration's first writers waited for the
    previous iteration's last readers, and the loop ran one iteration at a time (1.23x the
    unrolled program's simulated time); placed off the bytes freed since the previous loop
    began, where SBUF has room, the rolled program runs within 1.15x of the unrolled one (1.09x
    measured), race-free and with the same result. (The softmax is kept its own loop here, as it
    was: joined to the scores' nest as a wide-row epilogue, the default, its row blocks of 8 KiB
    rows leave no room for a second copy, and both programs are faster: 665.6 and 560.9 us.)"""
    text = hlo_gen.hlo_text("attention", seq=2048, d=512, layers=1)
    rng = np.random.default_rng(2)
    inputs = {"arg0": 0.1 * rng.standard_normal((2048, 512)).astype(np.float32)}
    inputs.update({f"arg{k}": 0.1 * rng.standard_normal((512, 512)).astype(np.float32) for k in (1, 2, 3)})
    results = {}
    passes = ",".join(p if p != "epilogues" else "epilogues{row_wise=0}" for p in pass_list("", 2))
    for mode in ("rolled", "unrolled"):
        program = _bir(text, mode, passes=passes)
        compile_program(program, default_pipeline(2))
        results[mode] = simulate_neff(build_neff(program), inputs)
    rolled, unrolled = results["rolled"], results["unrolled"]
    assert not rolled.races and rolled.deadlock is None
    np.testing.assert_array_equal(rolled.outputs["out0"], unrolled.outputs["out0"])
    assert rolled.simulated_ns <= 1.15 * unrolled.simulated_ns


@pytest.mark.slow
def test_a_rotating_copy_written_again_does_not_hide_the_previous_iterations_read_of_the_other_copy():
    """Attention at seq 2048, d 1024 with four iterations a body: allocation puts the softmax
    body's sum (4 bytes, two copies) at the address of its probabilities' tile (8 KiB, two
    copies), so the sum's second copy lies inside the tile's first. The tile's later write at
    iteration r covers the tile's accesses at iteration r only (its other copy at r - 1 was
    read by a store that the sum's write at r must wait for); retiring that read as covered left
    80 races between the store and the sum."""
    text = hlo_gen.hlo_text("attention", seq=2048, d=1024, layers=1)
    program = lower_module(parse_module_text(text.encode()))
    optimize(program, pass_list("", 2), num_stages=0)
    bir = BirCodeGenLoop(program, "trn1", "rolled", jam=4).run()
    compile_program(bir, default_pipeline(2))
    rng = np.random.default_rng(0)
    inputs = {"arg0": 0.1 * rng.standard_normal((2048, 1024)).astype(np.float32)}
    inputs.update({f"arg{k}": 0.1 * rng.standard_normal((1024, 1024)).astype(np.float32) for k in (1, 2, 3)})
    result = simulate_neff(build_neff(bir), inputs)
    assert not result.races and result.deadlock is None


DOT = """HloModule dot
ENTRY main {
  x = f32[512,1024] parameter(0)
  w = f32[1024,1536] parameter(1)
  ROOT d = f32[512,1536] dot(x, w), lhs_contracting_dims={1}, rhs_contracting_dims={0}
}
"""


def test_a_dots_lhsT_tiles_are_an_indexed_array_and_its_reduction_axis_rolls():
    """The lhsT tiles a dot loads at its first column tile and reads at every later one are an
    indexed array (one buffer, a block per reduction step, addressed by the iteration), so the
    reduction axis stays a loop in every column tile, in less than half the instructions; the
    rolled NEFF computes what the unrolled one does, race-free."""
    program = _bir(DOT)
    arrays = [b for b in program.buffers if "lhsT" in b.name and "*" in b.name]
    assert arrays and not any(b.HasField("private_to") and b.slots for b in arrays)
    k_loops = [i for i in _entries(program) if i.name.endswith("loop.k")]
    assert len(k_loops) >= 2  # the first column tile's, and the column loop's
    moving = [ap for i in program.instructions for ap in i.inputs
              if ap.tensor in {b.name for b in arrays} and ap.loop and ap.loop[-1].step]
    assert moving  # the matmul's lhsT moves by a block per reduction step
    neffs = {}
    for mode in ("rolled", "unrolled"):
        bir = _bir(DOT, mode)
        compile_program(bir, default_pipeline(2))
        neffs[mode] = build_neff(bir)
    rng = np.random.default_rng(2)
    inputs = {"arg0": rng.standard_normal((512, 1024)).astype(np.float32),
              "arg1": rng.standard_normal((1024, 1536)).astype(np.float32)}
    results = {mode: simulate_neff(neff, inputs) for mode, neff in neffs.items()}
    assert not results["rolled"].races and results["rolled"].deadlock is None
    np.testing.assert_array_equal(results["rolled"].outputs["out0"], results["unrolled"].outputs["out0"])
    assert 2 * len(program.instructions) < len(_bir(DOT, "unrolled").instructions)


# A 3x3 convolution's im2col copy: per (image, output row), three kernel rows of 56 positions x
# (3 taps x 64 features), each a load and a store of 43 KB, 56 rows in a 128-partition tile.
CONV3X3 = """HloModule conv3x3
ENTRY main {
  x = f32[2,56,56,64] parameter(0)
  w = f32[3,3,64,64] parameter(1)
  ROOT y = f32[2,56,56,64] convolution(x, w), window={size=3x3 pad=1_1x1_1}, dim_labels=b01f_01io->b01f
}
"""


def test_a_copy_loop_of_three_kernel_rows_holds_its_copies_in_the_loop_around_it():
    """The three kernel rows would be an innermost rolled axis needing three copies in a body,
    its whole trip (a body of six transfers kept six queues busy: ResNet stage 1's im2col copies,
    1.9 ms each); direct_copies now takes them into each dma's box, so the loop of output rows is
    the innermost and its body holds several of its own iterations, its transfers spread over
    the queues. The pieces a transfer is cut in count the rows the tile holds (56), not 128."""
    program = lower_module(parse_module_text(CONV3X3.encode()))
    optimize(program, pass_list("", 2), num_stages=0)
    tensors = {t.name: t for t in program.tensors}
    users = rolling.onchip_users(program)
    (nest,) = [n for n in program.nests if n.name.endswith(".copy_4")]
    extents = {axis.name: axis.extent for axis in nest.axes}
    plan = rolling.plan_rolling(nest, tensors, rolling.TouchedElsewhere(users, nest.name), min_trip=2)
    assert [extents[axis.name] for axis in plan.axes] == [2, 56]  # the kernel rows unroll in the body
    assert plan.copies > 1
    bir = lower_to_bir(program, loops="rolled", small_nest=0)
    (rows,) = [i for i in _entries(bir) if i.name.endswith(".copy_4/loop.b1")]
    body = [i for i in bir.instructions if i.op == "dma" and i.HasField("in_loop") and i.in_loop == rows.id]
    # copies of the output row, each one HBM-to-HBM dma of its three kernel rows (direct_copies
    # takes the kernel-row loop into the dma's box)
    assert len(body) == plan.copies * len(nest.statements)
    assert all(3 in [d.count for d in dma.inputs[0].dims] for dma in body)


def test_auto_keeps_one_loop_per_nest_where_the_unrolled_inner_ones_fit(monkeypatch):
    """Attention at seq 4096, d 1024 is large enough for --loops auto to roll it. Rolled as far as
    it goes, its nests keep loops inside loops; auto keeps only each nest's outermost loop, the
    others unrolled into its body (so the body's independent tiles interleave), except a dot's
    reduction loop whose tiles would crowd one body (the scores' product with V: 32 K tiles), while
    the program stays within AUTO_SHALLOW_TOTAL, and is rolled as deep as `rolled` past it."""
    from ncc.tools.hlo_opt import bir_codegen

    text = hlo_gen.hlo_text("attention", seq=4096, d=1024, layers=1)

    def nested_loops(mode: str) -> tuple[int, list[str]]:
        entries = _entries(_bir(text, mode))
        return len(entries), sorted(entry.name for entry in entries if entry.HasField("in_loop"))

    rolled_loops, rolled_nested = nested_loops("rolled")
    auto_loops, auto_nested = nested_loops("auto")
    assert auto_loops > 0 and len(auto_nested) < len(rolled_nested)
    assert auto_nested and all(name.endswith("loop.k") for name in auto_nested)  # dots' reduction loops
    monkeypatch.setattr(bir_codegen, "AUTO_SHALLOW_TOTAL", 1_000)  # the program past the cap
    assert nested_loops("auto") == (rolled_loops, rolled_nested)


def test_the_loops_walked_in_a_forked_child_give_the_same_dependences_and_program():
    """With `fork` the analyzer walks the loop bodies (and searches what they carry) in a child
    while it walks the top level, then adds the child's edges in one process's order. Forced
    either way on a rolled two-layer attention: after the run that follows allocation, every
    node's predecessors in the same order with the same codes and the same carried dependences;
    after every pass, the same program."""
    text = hlo_gen.hlo_text("attention", seq=2048, d=512, layers=2)
    found = {}
    for fork in ("no", "yes"):
        passes = [p.replace("anti_dependency_analyzer", f"anti_dependency_analyzer{{fork={fork}}}")
                  for p in default_pipeline(2)]
        through = passes.index(f"anti_dependency_analyzer{{fork={fork}}}", 2) + 1  # the second run
        ctx, _ = compile_program(_bir(text), passes[:through])
        for run in ("anti_dependency_analyzer", "anti_dependency_analyzer#2"):
            assert ctx.stats[run]["forked"] == int(fork == "yes") and ctx.stats[run]["loops"] > 4
        graph = [(node, list(ctx.deps.pred_codes(node).items()), list(ctx.deps.successors(node)))
                 for node in ctx.deps.nodes]
        program = _bir(text)
        compile_program(program, passes)
        del program.attributes["walrus.pipeline"]
        found[fork] = (graph, list(ctx.carried), program.SerializeToString())
    assert found["yes"] == found["no"]
    assert found["no"][1]  # the loops carry something: the child's half was not empty
