"""The walrus pass manager: registry, pipeline text, default pipelines, instruments, statistics."""

from __future__ import annotations

import io
import sys

import pytest
from walrus_builders import chain_program, run_passes

from ncc.tools.common.errors import CompileError
from ncc.tools.target import load_target
from ncc.tools.walrus_driver.context import PassContext
from ncc.tools.walrus_driver.pass_manager import (
    DEFAULT_PASSES,
    Instruments,
    PassManager,
    PassSpec,
    default_pipeline,
    parse_pipeline,
)
from ncc.tools.walrus_driver.registry import PASSES, get_pass, load_passes, register

EXPECTED = {
    "split_dma",
    "anti_dependency_analyzer",
    "dep_reduction",
    "pre_sched",
    "post_sched",
    "allocation",
    "assign_hwdge_engine",
    "sync_dve_pool",
    "alloc_semaphores",
    "semaphore_reset",
    "lower_sync",
    "birverifier",
    "codegen",
    "roll_loops",
    "bir_sim",
}


def test_every_pass_is_registered_with_a_summary_and_a_module_name():
    passes = load_passes()
    assert set(passes) == EXPECTED
    for name, info in passes.items():
        module = sys.modules[info.run.__module__]
        assert module.NAME == name and module.__name__.endswith(f".{name}")
        assert info.summary and info.summary[0].isupper() and len(info.description) > 100


def test_unknown_pass_suggests_the_closest_name():
    with pytest.raises(CompileError) as err:
        get_pass("pre_shed")
    assert err.value.code == "E401"
    assert "unknown walrus pass 'pre_shed' (known: alloc_semaphores, allocation," in err.value.message
    assert "did you mean 'pre_sched'?" in err.value.message


def test_unknown_pass_is_rejected_before_anything_runs():
    program = chain_program(1)
    before = program.SerializeToString()
    with pytest.raises(CompileError) as err:
        PassManager("anti_dependency_analyzer,allocation,foo")
    assert err.value.code == "E401"
    assert program.SerializeToString() == before


def test_parse_pipeline_with_options():
    specs = parse_pipeline(" a, b{x=1, y=two},c{} ,")
    assert specs == [PassSpec("a"), PassSpec("b", {"x": "1", "y": "two"}), PassSpec("c")]
    assert specs[1].text() == "b{x=1,y=two}"
    for bad in ("a{x=1", "a}", "a{x}"):
        with pytest.raises(CompileError) as err:
            parse_pipeline(bad)
        assert err.value.code == "E400"


def test_options_are_typed_and_checked():
    manager = PassManager("pre_sched{pressure_fraction=0.5,pressure_window=4},bir_sim{compare_sequential=no}")
    assert manager.plan[0][2].pressure_fraction == 0.5 and manager.plan[0][2].pressure_window == 4
    assert manager.plan[1][2].compare_sequential is False
    for bad in ("pre_sched{nope=1}", "pre_sched{pressure_window=many}", "codegen{x=1}"):
        with pytest.raises(CompileError) as err:
            PassManager(bad)
        assert err.value.code == "E400"


def test_default_pipelines():
    assert default_pipeline(2) == DEFAULT_PASSES
    assert "pre_sched" not in default_pipeline(0) and "dep_reduction" not in default_pipeline(0)
    assert "pre_sched" in default_pipeline(1) and "split_dma" not in default_pipeline(1)
    assert "pre_sched{tries=4,pressure_window=128}" in default_pipeline(3)
    assert default_pipeline(0)[-2:] == ["codegen", "roll_loops"]
    with pytest.raises(CompileError):
        default_pipeline(7)
    for level in range(4):
        program = chain_program(2)
        ctx = run_passes(program, ",".join(default_pipeline(level)))
        assert ctx.codegen_done and ctx.synchronized
        assert float(program.attributes["walrus.lower_bound_ns"]) > 0  # every level reports it
        if level == 3:  # four pressure limits, each with and without its loads held back
            assert ctx.stats["pre_sched"]["schedules_tried"] == 8


def test_print_ir_after_and_timing():
    out = io.StringIO()
    ctx = PassContext.for_program(chain_program(1), load_target("trn1"))
    manager = PassManager(
        DEFAULT_PASSES, Instruments(print_ir_after={"allocation", "codegen"}, timing=True, stream=out)
    )
    manager.run(ctx)
    text = out.getvalue()
    assert text.count("// ----- IR after") == 2 and "// ----- IR after allocation -----" in text
    assert "buf  x0 SBUF 128p x 256B @0" in text and "stream DVE" in text
    assert "walrus pass timing report" in text and "anti_dependency_analyzer#2" in text


def test_print_ir_after_all_and_unknown_name():
    out = io.StringIO()
    ctx = PassContext.for_program(chain_program(1), load_target("trn1"))
    PassManager("anti_dependency_analyzer,allocation", Instruments(print_ir_after={"all"}, stream=out)).run(
        ctx
    )
    assert out.getvalue().count("// ----- IR after") == 2
    with pytest.raises(CompileError) as err:
        PassManager("allocation", Instruments(print_ir_after={"alocation"}))
    assert err.value.code == "E401"


def test_report_holds_every_counter_and_time():
    ctx = PassContext.for_program(chain_program(2), load_target("trn1"))
    manager = PassManager(DEFAULT_PASSES, Instruments(verify_each=True))
    manager.run(ctx)
    report = manager.report(ctx)
    labels = [p["label"] for p in report["passes"]]
    assert labels[:2] == ["split_dma", "anti_dependency_analyzer"] and "anti_dependency_analyzer#2" in labels
    assert all(p["wall_s"] >= 0 for p in report["passes"]) and report["verify_each_wall_s"] > 0
    by_label = {p["label"]: p["stats"] for p in report["passes"]}
    assert by_label["allocation"]["sbuf_buffers"] == 8
    assert report["pipeline"] == ",".join(DEFAULT_PASSES)
    assert not any(k.startswith("verify-each") for k in ctx.stats)


def test_verify_each_catches_a_pass_that_breaks_the_program():
    @register("test_breaks_engines")
    def breaker(ctx: PassContext) -> None:
        ctx.program.instructions[2].engine = 1  # DVE add -> PE

    try:
        with pytest.raises(CompileError) as err:
            run_passes(chain_program(1), "anti_dependency_analyzer,test_breaks_engines", verify_each=True)
        assert err.value.code == "E410"
        assert "after pass test_breaks_engines" in err.value.message
        run_passes(chain_program(1), "test_breaks_engines", verify_each=False)  # silent without it
    finally:
        del PASSES["test_breaks_engines"]


def test_errors_carry_the_pass_as_location():
    with pytest.raises(CompileError) as err:
        run_passes(chain_program(1), "anti_dependency_analyzer,dep_reduction,dep_reduction,codegen")
    assert err.value.location == "codegen"


def test_a_list_of_pass_texts_may_carry_options():
    manager = PassManager(default_pipeline(3))
    assert "pre_sched{tries=4,pressure_window=128}" in manager.pipeline_text()
    ctx = PassContext.for_program(chain_program(2), load_target("trn1"))
    manager.run(ctx)
    assert ctx.stats["pre_sched"]["schedules_tried"] == 4 * 2  # limits, with and without held-back loads
