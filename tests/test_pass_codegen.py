"""codegen: one stream per engine used, each the global order filtered by engine."""

from __future__ import annotations

import pytest
from walrus_builders import chain_program, random_program, run_passes

from ncc.tools.common import forked
from ncc.tools.common.errors import CompileError
from ncc.tools.walrus_driver.pass_manager import DEFAULT_PASSES


def test_streams_follow_the_global_order():
    program = chain_program(tiles=3)
    ctx = run_passes(program, ",".join(DEFAULT_PASSES))
    engines = [s.engine for s in program.streams]
    assert len(engines) == len(set(engines)) == len({i.engine for i in program.instructions})
    for stream in program.streams:
        expected = [i.id for i in program.instructions if i.engine == stream.engine]
        assert [i.id for i in stream.instructions] == expected
    stats = ctx.stats["codegen"]
    assert stats["streams"] == len(engines)
    assert (
        stats["instructions"]
        == len(program.instructions)
        == sum(len(s.instructions) for s in program.streams)
    )
    assert stats["instructions_DVE"] == 3 and stats["waits"] == sum(
        len(i.waits) for i in program.instructions
    )
    assert ctx.codegen_done


def test_rerun_replaces_the_streams():
    program = chain_program(tiles=1)
    run_passes(program, ",".join(DEFAULT_PASSES) + ",codegen")
    assert sum(len(s.instructions) for s in program.streams) == len(program.instructions)


def test_needs_allocation_and_semaphores():
    with pytest.raises(CompileError) as err:
        run_passes(chain_program(1), "codegen")
    assert err.value.code == "E402" and "needs allocation" in err.value.message
    with pytest.raises(CompileError) as err:
        run_passes(chain_program(1), "allocation,codegen")
    assert "needs alloc_semaphores" in err.value.message


@pytest.mark.parametrize("seed", [2, 9])
def test_work_on_the_spare_core_leaves_the_program_as_one_process_makes_it(seed: int, monkeypatch):
    """From forked.MIN_INSTRUCTIONS up, the analyzer walks half of its pages in a child and
    codegen's lower bound is computed in one while alloc_semaphores runs; forced on and off on
    the same program, the compiled programs are the same bytes."""
    compiled = []
    for threshold in (0, 10**9):
        monkeypatch.setattr(forked, "MIN_INSTRUCTIONS", threshold)
        program = random_program(seed, steps=200)
        ctx = run_passes(program, ",".join(DEFAULT_PASSES), verify_each=False)
        assert ctx.stats["anti_dependency_analyzer"]["forked"] == int(threshold == 0)
        assert ctx.final_bound is None  # codegen took it
        compiled.append(program.SerializeToString())
    assert compiled[0] == compiled[1]
    assert float(program.attributes["walrus.lower_bound_ns"]) > 0
