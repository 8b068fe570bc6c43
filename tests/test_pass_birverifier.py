"""birverifier: a compiled program passes; each broken rule fails with its named check (E410)."""

from __future__ import annotations

from collections.abc import Callable

import pytest
from walrus_builders import ACT, DVE, POOL, PSUM, SP, Bir, by_name, chain_program, hbm_ap, run_passes, tile

from ncc.schemas import bir_pb2, common_pb2
from ncc.tools.common.errors import CompileError
from ncc.tools.walrus_driver.pass_manager import DEFAULT_PASSES, PassManager

# the default pipeline but split_dma, so that the cases below find the instructions they break by name
WHOLE_DMAS = ",".join(p for p in DEFAULT_PASSES if p != "split_dma")


def matmul_program() -> bir_pb2.Program:
    """load s, load m -> matmul into PSUM -> ACT copies to SBUF -> store; compiled."""
    b = Bir("mm")
    b.hbm("x", [128, 128])
    b.hbm("out", [128, 128], role=bir_pb2.OUTPUT)
    b.buffer("s", 512)
    b.buffer("m", 512)
    b.buffer("p", 512, memory=PSUM)
    b.buffer("o", 512)
    b.load("s", "x", 128, 128, name="load_s")
    b.load("m", "x", 128, 128, name="load_m")
    b.matmul("p", "s", "m", 128, 128, 128, name="mm")
    b.act("o", "p", 128, 128, func="identity", in_memory=PSUM, name="evict")
    b.add("tensor_copy", DVE, [tile("o", 128, 128)], [tile("o", 128, 128)], name="copy")
    b.store("out", "o", 128, 128, name="store")
    program = b.build()
    run_passes(program, WHOLE_DMAS)
    return program


def gather_program() -> bir_pb2.Program:
    """load indices -> POOL's dma_gather of table rows -> store; then dma_scatter of them back; compiled."""
    b = Bir("gather")
    b.hbm("table", [50, 64])
    b.hbm("rows", [128, 1], dtype=common_pb2.S32, index=1)
    b.hbm("out", [128, 64], role=bir_pb2.OUTPUT)
    b.buffer("i", 4)
    b.buffer("g", 256)
    index = tile("i", 128, 1, dtype=common_pb2.S32)
    b.add("dma", SP, [index], [hbm_ap("rows", 128, 1, dtype=common_pb2.S32)], name="load_i")
    b.add("dma_gather", POOL, [tile("g", 128, 64)], [hbm_ap("table", 50, 64), index], name="gather")
    b.store("out", "g", 128, 64, name="store")
    b.add("dma_scatter", POOL, [hbm_ap("table", 50, 64)], [tile("g", 128, 64), index], name="scatter")
    program = b.build()
    run_passes(program, WHOLE_DMAS)
    return program


INDIRECT_CASES: list[tuple[str, Mutation]] = [
    ("swdge_engine", lambda p: setattr(by_name(p)["gather"], "engine", SP)),
    ("swdge_engine", lambda p: setattr(by_name(p)["scatter"], "engine", ACT)),
    ("indirect_index", lambda p: setattr(by_name(p)["gather"].inputs[1], "dtype", common_pb2.F32)),
    ("indirect_operands", lambda p: by_name(p)["gather"].inputs[0].CopyFrom(by_name(p)["store"].inputs[0])),
    ("element_count", lambda p: setattr(by_name(p)["gather"].inputs[0].dims[1], "count", 32)),
]


@pytest.mark.parametrize(("check", "mutate"), INDIRECT_CASES,
                         ids=[f"{c}-{i}" for i, (c, _) in enumerate(INDIRECT_CASES)])
def test_each_broken_indirect_dma_rule_is_named(check, mutate):
    program = gather_program()
    verify(program, deps=True)  # the compiled program passes, POOL triggering both indirect dmas
    mutate(program)
    with pytest.raises(CompileError) as err:
        verify(program)
    assert err.value.code == "E410"
    first, _, more = err.value.message.partition(" (and ")
    assert first.startswith(f"birverifier: {check}: ") or check in more, err.value.message


def verify(program: bir_pb2.Program, options: str = "", deps: bool = False) -> None:
    """Run the verifier on a compiled program (with `deps`, after recomputing the dependences, so
    that every edge's synchronization is checked too)."""
    passes = "anti_dependency_analyzer," if deps else ""
    run_passes(program, f"{passes}birverifier{options}", verify_each=False)


def buffer(program: bir_pb2.Program, name: str) -> bir_pb2.Buffer:
    return next(b for b in program.buffers if b.name == name)


def first_wait(program: bir_pb2.Program) -> bir_pb2.Instruction:
    return next(i for i in program.instructions if i.waits)


def set_threshold(wait: bir_pb2.SemaphoreWait, value: int) -> None:
    """A new threshold, encoded as lower_sync would."""
    wait.value, wait.value_lo, wait.value_hi = value, value, 0


def drop_streams(program: bir_pb2.Program) -> None:
    del program.streams[:]


Mutation = Callable[[bir_pb2.Program], None]

CASES: list[tuple[str, Mutation]] = [
    ("engine_rule", lambda p: setattr(by_name(p)["mm"], "engine", DVE)),
    ("engine_rule", lambda p: setattr(by_name(p)["evict"], "engine", DVE)),
    (
        "pool_psum",
        lambda p: (
            setattr(by_name(p)["evict"], "engine", POOL),
            setattr(by_name(p)["evict"], "op", "tensor_copy"),
        ),
    ),
    ("matmul_psum", lambda p: setattr(by_name(p)["mm"].outputs[0], "dtype", 2)),
    ("partitions", lambda p: setattr(by_name(p)["copy"].inputs[0], "partition_start", 64)),
    ("allocated", lambda p: setattr(buffer(p, "o"), "address", -1)),
    ("address_bounds", lambda p: setattr(buffer(p, "o"), "address", 180224 - 256)),
    ("psum_bank", lambda p: setattr(buffer(p, "p"), "address", 1800)),
    ("allocation_overlap", lambda p: setattr(buffer(p, "m"), "address", buffer(p, "s").address + 64)),
    ("element_count", lambda p: setattr(by_name(p)["store"].outputs[0].dims[0], "count", 64)),
    ("bounds", lambda p: setattr(by_name(p)["load_s"].inputs[0], "offset", 128 * 128)),
    ("bounds", lambda p: setattr(by_name(p)["copy"].inputs[0], "offset", 4)),
    ("wait_limit", lambda p: first_wait(p).waits.extend([first_wait(p).waits[0]] * 2)),
    (
        "update_limit",
        lambda p: by_name(p)["store"].updates.extend([bir_pb2.SemaphoreUpdate(semaphore=0)] * 2),
    ),
    ("semaphore_id", lambda p: setattr(first_wait(p).waits[0], "semaphore", p.num_semaphores)),
    ("unsynchronized_dependence", lambda p: (drop_streams(p), first_wait(p).ClearField("waits"))),
    ("deadlock", lambda p: (drop_streams(p), set_threshold(first_wait(p).waits[0], 99))),
    ("wait_value", lambda p: setattr(first_wait(p).waits[0], "value_hi", 1)),
    ("wait_value", lambda p: first_wait(p).waits[0].ClearField("value_lo")),
    ("wait_value", lambda p: setattr(first_wait(p).waits[0], "value", -2)),
    ("operand_count", lambda p: by_name(p)["mm"].inputs.pop()),
    ("known_op", lambda p: setattr(by_name(p)["copy"], "op", "fft")),
    ("unique_ids", lambda p: setattr(by_name(p)["copy"], "id", by_name(p)["mm"].id)),
    ("operand_memory", lambda p: setattr(by_name(p)["copy"].inputs[0], "tensor", "nope")),
    ("operand_memory", lambda p: setattr(by_name(p)["copy"].inputs[0], "memory", PSUM)),
    ("dma_queue", lambda p: setattr(by_name(p)["store"], "dma_queue", 99)),
    ("onchip_operands", lambda p: by_name(p)["copy"].inputs[0].CopyFrom(by_name(p)["load_s"].inputs[0])),
    (
        "streams",
        lambda p: p.streams[0].instructions.reverse() if len(p.streams[0].instructions) > 1 else None,
    ),
    ("matmul_shape", lambda p: setattr(by_name(p)["mm"].inputs[1].dims[0], "count", 600)),
]


def test_compiled_programs_pass():
    verify(matmul_program(), deps=True)
    verify(_compiled_chain(), deps=True)


def _compiled_chain() -> bir_pb2.Program:
    program = chain_program(3)
    run_passes(program, WHOLE_DMAS)
    return program


def _broken(check: str, mutate: Mutation) -> bir_pb2.Program:
    """A compiled program that breaks rule `check` (by `mutate`)."""
    program = matmul_program()
    if check == "streams":
        program = _compiled_chain()
        program.streams.sort(key=lambda s: -len(s.instructions))
    mutate(program)
    return program


@pytest.mark.parametrize(("check", "mutate"), CASES, ids=[f"{c}-{i}" for i, (c, _) in enumerate(CASES)])
def test_each_broken_rule_is_named(check, mutate):
    program = _broken(check, mutate)
    with pytest.raises(CompileError) as err:
        verify(program, "{require_allocated=yes}", deps=check == "unsynchronized_dependence")
    assert err.value.code == "E410"
    first, _, more = err.value.message.partition(" (and ")
    assert first.startswith(f"birverifier: {check}: ") or check in more, err.value.message


def test_dependence_order_with_a_stale_graph():
    program = chain_program(1)
    ctx = run_passes(program, "anti_dependency_analyzer")
    program.instructions.reverse()  # the graph (still marked valid) now points backwards
    with pytest.raises(CompileError) as err:
        PassManager("birverifier{check_sync=yes}").run(ctx)
    assert err.value.message.startswith("birverifier: dependence_order: add0: comes before load_x0")


def test_message_names_instruction_and_counts_more_problems():
    program = matmul_program()
    drop_streams(program)
    by_name(program)["mm"].engine = ACT
    by_name(program)["evict"].engine = DVE
    with pytest.raises(CompileError) as err:
        verify(program)
    assert err.value.message.startswith("birverifier: engine_rule: mm: matmul runs on PE, not ACT")
    assert "(and 1 more: engine_rule)" in err.value.message and err.value.location == "mm"


def test_before_allocation_the_address_rule_waits():
    program = chain_program(1)
    ctx = run_passes(program, "birverifier")  # frontend output: nothing allocated yet, that is fine
    assert ctx.stats["birverifier"]["problems"] == 0
    with pytest.raises(CompileError) as err:
        run_passes(chain_program(1), "birverifier{require_allocated=yes}")
    assert "birverifier: allocated:" in err.value.message


def _message(program: bir_pb2.Program, fork: str, deps: bool) -> str:
    try:
        verify(program, f"{{require_allocated=yes,fork={fork}}}", deps)
    except CompileError as err:
        return err.one_line()
    return "ok"


def test_a_forked_verifier_reports_what_one_process_does():
    """With the synchronization half in a child, every broken rule gets the same diagnostic (its
    first problem and the count of the others) as when one process checks everything."""
    for check, mutate in CASES:
        program = _broken(check, mutate)
        copy = bir_pb2.Program.FromString(program.SerializeToString())
        deps = check == "unsynchronized_dependence"
        alone, forked = _message(program, "no", deps), _message(copy, "yes", deps)
        assert forked == alone and forked.startswith("[E410]"), (check, forked, alone)
    ctx = run_passes(matmul_program(), "anti_dependency_analyzer,birverifier{fork=yes}", verify_each=False)
    assert ctx.stats["birverifier"]["forked"] == 1 and ctx.stats["birverifier"]["sync_coverage_checked"] == 1
