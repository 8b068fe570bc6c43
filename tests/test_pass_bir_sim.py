"""bir_sim: the compiled program runs race-free in the simulator and matches sequential execution."""

from __future__ import annotations

import numpy as np
import pytest
from walrus_builders import Bir, chain_program, random_program, run_passes

from ncc.schemas import bir_pb2
from ncc.tools.common.errors import CompileError
from ncc.tools.sim.api import simulate_program
from ncc.tools.target import load_target
from ncc.tools.walrus_driver.analysis.costs import lower_bound_ns
from ncc.tools.walrus_driver.context import PassContext
from ncc.tools.walrus_driver.pass_manager import DEFAULT_PASSES, PassManager
from ncc.tools.walrus_driver.passes.bir_sim import random_inputs, sequential_program

FULL = ",".join(DEFAULT_PASSES) + ",bir_sim"


def test_compiled_chain_is_race_free_and_equal_to_sequential():
    program = chain_program(tiles=2)
    ctx = run_passes(program, FULL)
    stats = ctx.stats["bir_sim"]
    assert stats["races"] == 0 and stats["deadlock"] == 0 and stats["outputs_compared"] == 1
    assert 0 < stats["simulated_ns"] < stats["sequential_ns"]
    assert stats["simulated_over_lower_bound"] >= 1.0
    assert float(program.attributes["walrus.simulated_ns"]) == pytest.approx(stats["simulated_ns"], abs=0.1)


def test_reference_is_the_numpy_result():
    program = chain_program(tiles=2)
    inputs = random_inputs(program, 0)
    reference = simulate_program(sequential_program(program), inputs)
    np.testing.assert_allclose(reference.outputs["out0"], np.exp(inputs["arg0"] + inputs["arg1"]), rtol=1e-6)


def test_missing_semaphores_are_reported_as_a_race():
    with pytest.raises(CompileError) as err:
        run_passes(chain_program(tiles=1), "allocation,bir_sim")
    assert err.value.code == "E411" and "race" in err.value.message


def test_a_changed_result_is_E412():
    """A pass that changed what the program computes (here: by hand, after codegen) is caught."""
    program = chain_program(tiles=1)
    ctx = PassContext.for_program(program, load_target("trn1"))
    PassManager(",".join(DEFAULT_PASSES)).run(ctx)
    for instr in [*program.instructions, *(i for s in program.streams for i in s.instructions)]:
        if instr.op == "activation":
            instr.func = "tanh"
    with pytest.raises(CompileError) as err:
        PassManager("bir_sim").run(ctx)
    assert err.value.code == "E412" and "out0 differs" in err.value.message


def test_random_programs():
    for seed in range(4):
        ctx = run_passes(random_program(seed, steps=50), FULL)
        assert ctx.stats["bir_sim"]["races"] == 0


def test_inputs_are_seeded():
    program = chain_program(1)
    a, b = random_inputs(program, 3), random_inputs(program, 3)
    assert a.keys() == {"arg0", "arg1"} and all(np.array_equal(a[k], b[k]) for k in a)


def test_needs_allocation():
    with pytest.raises(CompileError) as err:
        run_passes(chain_program(1), "bir_sim")
    assert err.value.code == "E402"


def test_the_lower_bound_counts_each_transfers_fixed_latency_on_the_queues():
    # 64 tile copies of 8 KiB: their bytes take 1.3 µs of HBM bandwidth, but each transfer holds
    # a queue for the fixed latency too, so the 16 queues need 64 x (500 + 303) / 16 = 3.2 µs.
    b = Bir("small")
    b.hbm("x", [128 * 64, 16])
    b.hbm("out", [128 * 64, 16], role=bir_pb2.OUTPUT)
    for t in range(32):
        b.buffer(f"s{t}", 64)
        b.load(f"s{t}", "x", 128, 16, row0=128 * t)
        b.store("out", f"s{t}", 128, 16, row0=128 * t)
    program = b.build()
    ctx = run_passes(program, FULL)
    target = load_target()
    bound = lower_bound_ns(program.instructions, ctx.valid_deps(), target, flow_only=True)
    fixed = target.dma_fixed_latency_ns
    assert bound["dma_queues_ns"] >= 64 * fixed / target.dma_queues
    assert bound["dma_queues_ns"] > 2 * bound["dma_bandwidth_ns"]
    assert bound["lower_bound_ns"] == bound["dma_queues_ns"]
    assert ctx.stats["bir_sim"]["simulated_ns"] >= bound["lower_bound_ns"]
