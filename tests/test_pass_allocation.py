"""allocation: linear scan reuses freed space, never overlaps live buffers, obeys PSUM banks, E403 on OOM."""

from __future__ import annotations

import pytest
import walrus_builders
from walrus_builders import ACT, PSUM, SBUF, SP, Bir, chain_program, random_program, run_passes

from ncc.schemas import bir_pb2
from ncc.tools.common.errors import CompileError


def live_ranges(program: bir_pb2.Program) -> dict[str, tuple[int, int]]:
    ranges: dict[str, tuple[int, int]] = {}
    for position, instr in enumerate(program.instructions):
        for ap in [*instr.inputs, *instr.outputs]:
            if ap.memory in (SBUF, PSUM):
                first, _ = ranges.get(ap.tensor, (position, position))
                ranges[ap.tensor] = (first, position)
    return ranges


def assert_no_live_overlap(program: bir_pb2.Program) -> None:
    ranges = live_ranges(program)
    buffers = [b for b in program.buffers if b.name in ranges]
    for i, a in enumerate(buffers):
        for b in buffers[i + 1 :]:
            if a.memory != b.memory:
                continue
            share = (
                a.address < b.address + b.bytes_per_partition
                and b.address < a.address + a.bytes_per_partition
            )
            (a0, a1), (b0, b1) = ranges[a.name], ranges[b.name]
            assert not (share and a0 <= b1 and b0 <= a1), f"{a.name} and {b.name} overlap while live"


def sequence_of_tiles(n: int, size: int, memory: int = SBUF) -> bir_pb2.Program:
    """n short-lived buffers, each written then read once, one after the other."""
    b = Bir()
    b.hbm("x", [128, size // 4])
    b.hbm("out", [128, size // 4], role=bir_pb2.OUTPUT)
    for t in range(n):
        b.buffer(f"t{t}", size, memory=memory)
        b.load(f"t{t}", "x", 128, size // 4, name=f"load{t}")
        b.store("out", f"t{t}", 128, size // 4, name=f"store{t}")
    return b.build()


@pytest.mark.parametrize("policy", ["next_fit", "first_fit"])
def test_reuses_freed_space_and_never_overlaps_live_buffers(policy):
    program = sequence_of_tiles(8, 64 * 1024)  # 8 x 64 KiB in 176 KiB: needs reuse
    ctx = run_passes(program, f"allocation{{policy={policy}}}")
    assert ctx.stats["allocation"]["sbuf_reused_buffers"] > 0
    assert ctx.stats["allocation"]["sbuf_peak_bytes"] <= ctx.target.sbuf_usable_bytes
    assert all(b.address >= 0 for b in program.buffers)
    assert_no_live_overlap(program)
    if policy == "first_fit":
        assert {b.address for b in program.buffers} == {0}


def test_next_fit_delays_reuse():
    program = sequence_of_tiles(3, 1024)
    run_passes(program, "allocation")
    assert [b.address for b in program.buffers] == [0, 1024, 2048]  # plenty of room: no reuse yet


def test_random_programs_never_overlap():
    for seed in range(5):
        program = random_program(seed, steps=150)
        run_passes(program, "anti_dependency_analyzer,pre_sched,allocation", verify_each=False)
        assert_no_live_overlap(program)


def test_psum_buffers_do_not_cross_banks():
    b = Bir()
    b.buffer("s", 2048)
    b.buffer("p0", 1024, memory=PSUM)
    b.buffer("p1", 1536, memory=PSUM)  # would cross the 2 KiB boundary at 1024
    b.buffer("p2", 4096, memory=PSUM)  # two banks: starts on a bank boundary
    b.matmul("p0", "s", "s", 128, 128, 256)
    b.matmul("p1", "s", "s", 128, 128, 384)
    b.matmul("p2", "s", "s", 128, 128, 512)
    b.matmul("p0", "s", "s", 128, 128, 256, accumulate=True)
    b.matmul("p1", "s", "s", 128, 128, 384, accumulate=True)
    program = b.build()
    run_passes(program, "allocation{policy=first_fit}")
    address = {buf.name: buf.address for buf in program.buffers}
    assert address["p0"] == 0 and address["p1"] == 2048 and address["p2"] == 4096


def test_psum_buffers_of_two_banks_start_on_an_even_bank():
    # placed from bank 1 the first accumulator of two banks would leave banks 0, 3, 5 and 7 free,
    # and a fourth could not find two banks side by side
    b = Bir()
    b.buffer("s", 2048)
    b.buffer("p0", 2048, memory=PSUM)
    for name in ("p1", "p2", "p3"):
        b.buffer(name, 4096, memory=PSUM)
    for name, n in (("p0", 256), ("p1", 512), ("p2", 512), ("p3", 512)):
        b.matmul(name, "s", "s", 128, 128, n)
    for name, n in (("p0", 256), ("p1", 512), ("p2", 512), ("p3", 512)):
        b.matmul(name, "s", "s", 128, 128, n, accumulate=True)
    program = b.build()
    run_passes(program, "allocation{policy=first_fit}")
    address = {buf.name: buf.address for buf in program.buffers}
    assert address["p0"] == 0
    assert sorted(address[name] for name in ("p1", "p2", "p3")) == [4096, 8192, 12288]


def test_out_of_memory_names_the_buffer_and_sizes():
    b = Bir()
    b.hbm("x", [128, 16384])
    for name in ("a", "c", "d"):
        b.buffer(name, 64 * 1024)
    b.load("a", "x", 128, 16384)
    b.load("c", "x", 128, 16384)
    b.load("d", "x", 128, 16384)
    b.tt("a", "c", "d", 128, 16384)
    with pytest.raises(CompileError) as err:
        run_passes(b.build(), "allocation")
    assert err.value.code == "E403"
    assert "needs 65536 bytes per partition" in err.value.message
    assert "uses a.reload1, c, d at once: 196608 bytes per partition together" in err.value.message
    with pytest.raises(CompileError) as err:
        run_passes(b.build(), "allocation{spill=false}")
    assert "'d' needs 65536 bytes per partition" in err.value.message
    assert "only 49152 contiguous bytes of 180224 free" in err.value.message


BACKEND = (
    "anti_dependency_analyzer,assign_hwdge_engine,alloc_semaphores,semaphore_reset,birverifier,codegen,bir_sim"
)


def spilling_program(tiles: int = 6) -> bir_pb2.Program:
    """Loads `tiles` 32 KiB tiles first and uses them only at the end, in reverse: more than SBUF
    holds is live at once, although every instruction needs at most three tiles."""
    b = Bir("spill")
    cols = 8192
    b.hbm("x", [128 * tiles, cols], index=0)
    b.hbm("out", [128, cols], role=bir_pb2.OUTPUT, index=0)
    for t in range(tiles):
        b.buffer(f"in{t}", cols * 4)
        b.load(f"in{t}", "x", 128, cols, row0=128 * t, name=f"load{t}")
    b.buffer("acc0", cols * 4)
    b.act("acc0", f"in{tiles - 1}", 128, cols, func="tanh", name="first")
    for t in reversed(range(tiles - 1)):
        b.buffer(f"acc{tiles - t - 1}", cols * 4)
        b.tt(f"acc{tiles - t - 1}", f"acc{tiles - t - 2}", f"in{t}", 128, cols, name=f"add{t}")
    b.store("out", f"acc{tiles - 1}", 128, cols, name="store")
    return b.build()


def test_spills_when_sbuf_is_full_and_keeps_the_result():
    """bir_sim runs the allocated program with spills and compares it, bit for bit, with the
    program as received executed one instruction at a time; races fail it too."""
    ctx = run_passes(spilling_program(), "allocation," + BACKEND)
    stats = ctx.stats["allocation"]
    assert stats["spills"] >= 1 and stats["spilled_bytes_per_partition"] >= 32768
    assert stats["sbuf_peak_bytes"] <= 180224
    names = [i.name for i in ctx.program.instructions]
    assert any(".store/" in n for n in names) and any(".reload/" in n for n in names)
    spilled = [t for t in ctx.program.hbm if t.name.startswith("spill.")]
    assert spilled and all(t.role == bir_pb2.INTERNAL for t in spilled)
    assert_no_live_overlap(ctx.program)


def test_no_spill_when_everything_fits():
    ctx = run_passes(chain_program(4), "allocation," + BACKEND)
    assert ctx.stats["allocation"]["spills"] == 0
    assert "too_many_spills" not in ctx.program.attributes


def test_many_spills_mark_the_program():
    ctx = run_passes(spilling_program(8), "allocation{too_many_spills=1}," + BACKEND)
    assert ctx.stats["allocation"]["spills"] > 1
    assert ctx.program.attributes["too_many_spills"] == "1"


def test_psum_overflow_after_scheduling_falls_back_to_program_order():
    """Nine accumulation groups fit PSUM's eight banks one after another, not interleaved."""
    b = Bir("groups")
    b.hbm("x", [128, 128], index=0)
    b.hbm("out", [128, 512 * 9], role=bir_pb2.OUTPUT, index=0)
    b.buffer("s", 512)
    b.load("s", "x", 128, 128)
    for t in range(9):
        b.buffer(f"p{t}", 2048, memory=PSUM)
        b.buffer(f"o{t}", 2048)
        b.matmul(f"p{t}", "s", "s", 128, 128, 128)
        b.matmul(f"p{t}", "s", "s", 128, 128, 128, accumulate=True)
        b.act(f"o{t}", f"p{t}", 128, 128, func="identity", in_memory=PSUM)
    program = b.build()
    ctx = run_passes(program, "anti_dependency_analyzer")
    interleaved = sorted(
        ctx.program.instructions, key=lambda i: (i.op != "dma", i.op != "matmul", i.accumulate)
    )
    ctx.order_before_schedule = [i.id for i in ctx.program.instructions]
    load = next(i for i in interleaved if i.op == "dma")
    before = bir_pb2.Instruction()
    before.CopyFrom(load)
    ctx.triggers_before_schedule = {load.id: before}  # as if pre_sched had moved its trigger
    load.engine = ACT
    del ctx.program.instructions[:]
    ctx.program.instructions.extend(interleaved)
    from ncc.tools.walrus_driver.pass_manager import Instruments, PassManager

    PassManager("allocation", Instruments()).run(ctx)
    assert ctx.stats["allocation"]["psum_fallback_to_program_order"] == 1
    assert [i.id for i in ctx.program.instructions] == [i.id for i in program.instructions]
    assert next(i for i in ctx.program.instructions if i.op == "dma").engine == SP  # its trigger too


def test_psum_out_of_memory():
    b = Bir()
    b.buffer("s", 2048)
    for t in range(9):
        b.buffer(f"p{t}", 2048, memory=PSUM)
        b.matmul(f"p{t}", "s", "s", 128, 128, 512)
    for t in range(9):
        b.matmul(f"p{t}", "s", "s", 128, 128, 512, accumulate=True)
    with pytest.raises(CompileError) as err:
        run_passes(b.build(), "allocation")
    assert err.value.code == "E403" and "PSUM buffer 'p8'" in err.value.message


def test_invalidates_dependences_for_addresses():
    program = chain_program(2)
    ctx = run_passes(program, "anti_dependency_analyzer,allocation")
    assert ctx.deps_valid and not ctx.deps_valid_for_addresses and ctx.allocated
    with pytest.raises(CompileError) as err:
        run_passes(chain_program(2), "anti_dependency_analyzer,allocation,alloc_semaphores")
    assert err.value.code == "E402" and "after allocation" in err.value.message


def test_bad_policy_option():
    with pytest.raises(CompileError) as err:
        run_passes(chain_program(1), "allocation{policy=best}")
    assert err.value.code == "E400"


def test_past_max_rotating_every_loop_buffer_has_one_copy():
    # the loop's eight private buffers rotate through two copies, unless more would rotate than
    # max_rotating allows (the dependence analysis after allocation pays for every copy)
    passes = "anti_dependency_analyzer,pre_sched,allocation"
    small = {"cols": 1024, "held_cols": 1024}
    ctx = run_passes(walrus_builders.loop_beside_a_held_tile(**small), passes)
    assert ctx.stats["allocation"]["rotating_buffers"] == 8
    ctx = run_passes(walrus_builders.loop_beside_a_held_tile(**small), passes + "{max_rotating=7}")
    assert ctx.stats["allocation"]["rotating_buffers"] == 0
    assert all(buffer.slots <= 1 for buffer in ctx.program.buffers)
