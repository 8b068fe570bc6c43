"""Repeated blocks of straight-line HLO rolled back into a while loop (hlo2penguin/reroll.py):
which runs of blocks are found, what stops them, and that a rolled stack of layers compiles to the
same outputs as its layers unrolled."""

from __future__ import annotations

import json

import hlo_gen
import numpy as np
import pytest
from orchestrator_support import ncc

from ncc.schemas import bir_pb2, penguin_pb2
from ncc.tools.common import loops
from ncc.tools.hlo.hlo_reader import parse_module_text
from ncc.tools.hlo.hlo_types import entry_computation
from ncc.tools.hlo.hlo_verify import verify_module
from ncc.tools.hlo2penguin import reroll
from ncc.tools.hlo2penguin.hlo_cse import alike_computations
from ncc.tools.hlo2penguin.lower import lower_module
from ncc.tools.hlo_opt import bir_codegen

BIG = "f32[4096,4096]"  # 256 tiles an op: the blocks below hold enough work to roll


def _chain(blocks: int, reads: str = "x{i}", tail: str = "") -> str:
    """`blocks` blocks of x{i+1} = tanh(x{i} * w + c) over BIG; `reads` is the multiply's other
    operand in block i (w: the weight, every block the same)."""
    lines = [f"  x0 = {BIG} parameter(0)", f"  w = {BIG} parameter(1)", "  k = f32[] constant(0.5)",
             f"  c = {BIG} broadcast(k), dimensions={{}}"]
    for i in range(blocks):
        other = reads.format(i=i, prev=max(i - 1, 0))
        lines += [f"  m{i} = {BIG} multiply(x{i}, {other})", f"  a{i} = {BIG} add(m{i}, c)",
                  f"  x{i + 1} = {BIG} tanh(a{i})"]
    lines += tail.format(last=blocks).splitlines()
    root = lines[-1].split("=")[0].strip()
    return "HloModule chain\n\nENTRY main {\n" + "\n".join(lines) + f"\n  ROOT out = {BIG} copy({root})\n}}\n"


def _region(text: str) -> reroll.Region | None:
    module = parse_module_text(text.encode())
    return reroll.find_region(entry_computation(module), alike_computations(module))


@pytest.fixture
def no_grouping(monkeypatch):
    """Blocks rolled one to a trip, whatever they carry: the tests look at which blocks are found."""
    monkeypatch.setattr(reroll, "WORK_PER_CARRIED_TILE", 0)


def test_blocks_reading_the_one_before_and_a_shared_weight_roll_into_one_loop(no_grouping):
    region = _region(_chain(6, reads="w"))
    assert (region.start, region.period, region.blocks) == (4, 3, 6)
    assert region.carried == (2,) and region.initial == (0,)  # x{i+1}, from x0
    assert region.invariants == (1, 3)  # w and the broadcast constant
    module = reroll.reroll_repeats(parse_module_text(_chain(6, reads="w").encode()))
    verify_module(module)
    entry = entry_computation(module)
    assert [i.opcode for i in entry.instructions].count("while") == 1
    assert not any(i.opcode == "tanh" for i in entry.instructions)


def test_a_block_that_reads_two_blocks_back_is_not_rolled(no_grouping):
    """Block i multiplies by x{i-1}: a value two blocks old is carried, not one."""
    assert _region(_chain(6, reads="x{prev}")) is None


def test_a_value_read_after_the_blocks_that_is_not_carried_shortens_the_run(no_grouping):
    """After the blocks, a6 (the last block's add, which no block carries) is read: the last
    block stays straight-line code and reads the loop's result."""
    text = _chain(7, reads="w", tail=f"  y = {BIG} add(a6, x{{last}})")
    assert _region(text).blocks == 6
    module = reroll.reroll_repeats(parse_module_text(text.encode()))
    verify_module(module)
    assert [i.opcode for i in entry_computation(module).instructions].count("tanh") == 1


def test_too_few_blocks_or_too_little_work_are_not_rolled(no_grouping, monkeypatch):
    assert _region(_chain(reroll.MIN_BLOCKS - 1, reads="w")) is None
    monkeypatch.setattr(reroll, "MIN_WORK", 3 * 256 * 6 + 1)
    assert _region(_chain(6, reads="w")) is None


def test_elementwise_blocks_are_grouped_until_a_trip_pays_for_its_carries():
    """Three elementwise ops a block carry a whole tensor: unrolled, consecutive blocks fuse and
    keep it on chip, so a trip must hold WORK_PER_CARRIED_TILE ops per carried tile's worth."""
    assert _region(_chain(40, reads="w")) is None  # 40 blocks: fewer than MIN_BLOCKS trips of 43
    region = _region(_chain(43 * 4 + 2, reads="w"))
    assert region.period == 3 * 43 and region.blocks == 4


def test_blocks_that_reduce_without_a_dot_need_more_work_a_trip():
    """The same count of blocks, each normalizing its rows (a sum, a divide) instead of adding a
    constant: unrolled, such blocks fuse, and rolled 26 to a trip one such chain ran 1.29x
    slower; a trip must hold REDUCING_WORK_PER_CARRIED_TILE tiles of work per carried tile."""
    blocks = 64 * 4 + 2  # at WORK_PER_CARRIED_TILE, 4 trips of 64 (multiply, sum, divide: 513 tiles)
    add = """HloModule sums

add {
  a = f32[] parameter(0)
  b = f32[] parameter(1)
  ROOT s = f32[] add(a, b)
}

ENTRY main {
"""
    lines = [f"  x0 = {BIG} parameter(0)", f"  w = {BIG} parameter(1)", "  z = f32[] constant(0)"]
    for i in range(blocks):
        lines += [f"  m{i} = {BIG} multiply(x{i}, w)",
                  f"  s{i} = f32[4096] reduce(m{i}, z), dimensions={{1}}, to_apply=add",
                  f"  b{i} = {BIG} broadcast(s{i}), dimensions={{0}}",
                  f"  x{i + 1} = {BIG} divide(m{i}, b{i})"]
    assert _region(add + "\n".join(lines) + f"\n  ROOT out = {BIG} copy(x{blocks})\n}}\n") is None
    assert _region(_chain(blocks, reads="w")) is not None


def test_a_random_number_in_the_block_is_never_rolled(no_grouping):
    lines = _chain(6, reads="w").splitlines()
    for i in range(6):  # each block's constant c replaced by a fresh random draw
        lines = [line.replace(f"a{i} = {BIG} add(m{i}, c)",
                              f"r{i} = {BIG} rng(k, k), distribution=rng_uniform\n"
                              f"  a{i} = {BIG} add(m{i}, r{i})") for line in lines]
    assert _region("\n".join(lines)) is None


def test_a_stack_of_shared_weight_layers_is_one_kept_loop():
    """hlo_gen's attention stack (one set of weights for every layer) lowers to one Repeat region
    running a layer a trip; the unrolled lowering has a layer's nests per layer."""
    module = parse_module_text(hlo_gen.attention(4096, 1024, 9).encode())
    rolled = lower_module(module, "rolled")
    unrolled = lower_module(module, "unrolled")
    assert [(r.trips) for r in rolled.repeats] == [9]
    assert len(unrolled.nests) > 7 * len(rolled.nests)


@pytest.mark.slow
def test_a_rolled_stack_of_layers_matches_its_unrolled_compile(tmp_path):
    """Eight attention layers at seq 1024, d 512, rolled two layers a trip: `--verify` holds the
    NEFF to the golden evaluation of the module as written, and `ncc run` gives the unrolled
    compile's outputs."""
    model = tmp_path / "att.hlo"
    model.write_text(hlo_gen.attention(1024, 512, 8))
    rng = np.random.default_rng(0)
    np.savez(tmp_path / "in.npz", arg0=rng.standard_normal((1024, 512)).astype(np.float32) * 0.1,
             **{f"arg{i}": rng.standard_normal((512, 512)).astype(np.float32) * 0.04 for i in (1, 2, 3)})
    outputs = {}
    for mode in ("auto", "unrolled"):
        neff = tmp_path / f"{mode}.neff"
        result = ncc("compile", model, "--loops", mode, "--verify", "-o", neff,
                     "--workdir", tmp_path / mode)
        assert result.returncode == 0, result.stderr
        run = ncc("run", neff, "--inputs", tmp_path / "in.npz", "--output", tmp_path / f"{mode}.npz")
        assert run.returncode == 0, run.stderr
        with np.load(tmp_path / f"{mode}.npz") as out:
            outputs[mode] = out["out0"]
    program = penguin_pb2.Program()
    program.ParseFromString((tmp_path / "auto" / "01_HLOToTensorizer" / "penguin.pb").read_bytes())
    assert [r.trips for r in program.repeats] == [4]
    np.testing.assert_allclose(outputs["auto"], outputs["unrolled"], rtol=1e-5, atol=1e-6)
    # ncc run found no race: the layer loop's carried waits, kept only where a stream has not
    # already waited for as much, are enough (every instruction waited on every thread: 802)
    (walrus,) = (tmp_path / "auto").glob("*_WalrusDriver")
    stats = json.loads((walrus / "stats.json").read_text())
    (semaphores,) = [p["stats"] for p in stats["passes"] if p["name"] == "alloc_semaphores"]
    assert semaphores["carried_waits"] < 200


def test_a_rolled_layer_a_trip_is_synchronized_as_a_barrier_between_trips(tmp_path):
    """The 9-layer attention's trip writes 623 instructions but executes 37k: its trips barely
    overlap, and its dependences pair by pair were 120k carried edges. Its loop is a barrier loop
    (bir_codegen.BARRIER_TRIP): every thread's first instruction follows every other's last."""
    model = tmp_path / "att.hlo"
    model.write_text(hlo_gen.attention(4096, 1024, 9))
    result = ncc("compile", model, "--loops", "rolled", "-o", tmp_path / "a.neff",
                 "--workdir", tmp_path / "w")
    assert result.returncode == 0, result.stderr
    bir = bir_pb2.Program()
    bir.ParseFromString((tmp_path / "w" / "02_Frontend" / "bir.pb").read_bytes())
    (layer,) = [i for i in bir.instructions if i.op == loops.LOOP_OP and i.trip_count == 9]
    assert layer.body_length < bir_codegen.BARRIER_BODY
    assert layer.attributes[loops.CARRIED] == loops.BARRIER
    stats = json.loads((tmp_path / "w" / "03_WalrusDriver" / "stats.json").read_text())
    analyses = [p["stats"] for p in stats["passes"] if p["name"] == "anti_dependency_analyzer"]
    assert all(a["edges_carried"] < 10_000 for a in analyses)


def test_a_search_that_finds_nothing_stops_within_its_steps(monkeypatch):
    """A running product by a new parameter at every step looks periodic at every period (the
    same multiply, its operands shifted), but no block carries from one to the next alone: each
    reads a parameter of its own. The search gives up after SEARCH_STEPS (it took 22 s on 8,000
    instructions) and says there is nothing to roll; a search with steps to spare still finds
    the chain's blocks."""
    lines = [f"  p{i} = f32[8] parameter({i})" for i in range(2001)]
    lines += ["  m0 = f32[8] multiply(p0, p0)"]
    lines += [f"  m{i} = f32[8] multiply(m{i - 1}, p{i})" for i in range(1, 2000)]
    text = "HloModule product\n\nENTRY main {\n" + "\n".join(lines) + "\n  ROOT r = f32[8] negate(m1999)\n}\n"
    steps = []
    spend = reroll._Search._spend
    monkeypatch.setattr(reroll._Search, "_spend", lambda self, n: (steps.append(n), spend(self, n)))
    assert _region(text) is None
    assert sum(steps) <= reroll.SEARCH_STEPS + max(steps)
    monkeypatch.setattr(reroll, "WORK_PER_CARRIED_TILE", 0)
    assert _region(_chain(6, reads="w")) is not None
