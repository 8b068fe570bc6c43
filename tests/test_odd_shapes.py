"""Models no part of ncc was tuned on (tests/data/odd/, scripts/make_odd_shapes_fixture.py): prime and
off-by-a-few extents, so row tiles end in part tiles and reductions and contractions run over
tails; a strided, dilated, padded convolution, a padded max pool, batched bf16 heads, a
scatter by segment ids, a bf16 convolution with an f32 result and a loop whose inner loop runs
as many trips as the outer one's counter (session 24's models nobody tuned for: refused before).
Each compiles with its loops rolled and with `auto`, verifies against the golden evaluator, runs
race-free, and matches JAX's outputs; rolled and auto compute the same values."""

from __future__ import annotations

import shutil
from pathlib import Path

import numpy as np
import pytest
from orchestrator_support import ROOT, compile_and_run

ODD = ROOT / "tests" / "data" / "odd"
MODELS = sorted(path.name.removesuffix(".hlo.pb") for path in ODD.glob("*.hlo.pb"))
# bf16 operands, f32 accumulation: JAX rounds its own way
RELATIVE_L2 = {"mlp_bf16": 2e-3, "attention_bhqk": 4e-3}
F32_RELATIVE_L2 = 1e-5


def test_the_fixtures_are_there():
    assert MODELS == ["attention_300", "attention_bhqk", "chain_1031", "conv_bf16_f32", "conv_dilated",
                      "maxpool_mean", "mlp_bf16", "reduce_3_129_65", "segment_sum", "triangular_loop"]


@pytest.mark.slow
@pytest.mark.parametrize("model", MODELS)
def test_an_odd_shape_compiles_rolled_and_auto_and_matches_jax(model: str, tmp_path: Path) -> None:
    inputs = tmp_path / f"{model}.io.npz"
    shutil.copy(ODD / f"{model}.io.npz", inputs)
    expected = np.load(inputs)
    outputs = {}
    for loops in ("rolled", "auto"):
        report = compile_and_run(ODD / f"{model}.hlo.pb", inputs, loops, "--loops", loops)
        got = report["out0"].astype(np.float64)
        want = expected["out0"].astype(np.float64)
        assert got.shape == want.shape
        error = np.linalg.norm(got - want) / np.linalg.norm(want)
        assert error <= RELATIVE_L2.get(model, F32_RELATIVE_L2), (loops, error)
        outputs[loops] = got
    np.testing.assert_array_equal(outputs["rolled"], outputs["auto"])


def test_a_rolled_max_pool_keeps_its_dma_queues_evenly_busy(tmp_path: Path) -> None:
    """A program that keeps loops is list-scheduled block by block; a block's transfers start from
    the load the blocks before left on each queue, every run of a body counted. Scheduled each on
    fresh queues, every body put its first transfers on queues 0, 1, ... in turn: the max pool's
    busiest queue ran 2.15x the mean, and the program 24.3 us instead of 18.0."""
    inputs = tmp_path / "maxpool_mean.io.npz"
    shutil.copy(ODD / "maxpool_mean.io.npz", inputs)
    report = compile_and_run(ODD / "maxpool_mean.hlo.pb", inputs, "rolled", "--loops", "rolled")
    busy = [report["engine_busy_ns"].get(f"q{queue}", 0.0) for queue in range(16)]
    assert max(busy) <= 1.3 * sum(busy) / len(busy), busy
