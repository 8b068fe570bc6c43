"""The JAX model zoo (scripts/make_zoo.py): real HLO with convolutions, pools, gathers, KV-cache
updates, scan loops, argmax, cumulative sums and padding compiles at every optimization level,
runs race-free and matches JAX: every output, integers exactly, floats within 1e-4 absolute or
relative to the output's largest value."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest
from conftest import MODELS_DIR, run_ncc

ZOO = sorted(name for name, entry in json.loads((MODELS_DIR / "index.json").read_text()).items()
             if entry.get("zoo"))
# every level from the proto, and the default level from the text
RUNS = [(name, ".hlo.pb", level) for name in ZOO for level in "0123"] + [(name, ".hlo", "2") for name in ZOO]


def test_the_zoo_is_there() -> None:
    assert {"cnn", "decoder_step", "rnn", "sample_head", "cumsum", "padded_batch", "scatter_add", "cnn_train",
            "bit_hash", "nan_guard", "vae_sample", "depthwise_train", "rnn_long"} <= set(ZOO)


@pytest.mark.slow
@pytest.mark.parametrize(("model", "suffix", "optlevel"), RUNS, ids=[f"{m}{s}-O{o}" for m, s, o in RUNS])
def test_zoo_model_matches_jax(tmp_path: Path, model: str, suffix: str, optlevel: str) -> None:
    neff, out, report = tmp_path / "m.neff", tmp_path / "out.npz", tmp_path / "report.json"
    compiled = run_ncc("compile", str(MODELS_DIR / f"{model}{suffix}"), "--output", str(neff),
                       "--optlevel", optlevel, timeout=300)
    assert compiled.returncode == 0, compiled.stderr
    io = MODELS_DIR / f"{model}.io.npz"
    ran = run_ncc("run", str(neff), "--inputs", str(io), "--output", str(out), "--report", str(report),
                  timeout=300)
    assert ran.returncode == 0, ran.stderr
    facts = json.loads(report.read_text())
    assert facts["races"] == [] and not facts["deadlock"]
    with np.load(io) as expected_all, np.load(out) as got_all:
        names = sorted(n for n in expected_all.files if n.startswith("out"))
        assert names and set(names) <= set(got_all.files)
        for name in names:
            expected, got = expected_all[name], got_all[name]
            assert got.shape == expected.shape, name
            if expected.dtype.kind in "biu":
                assert np.array_equal(got, expected), f"{model} {name}: integers differ"
            else:
                bound = 1e-4 * max(1.0, float(np.max(np.abs(expected))))
                error = float(np.max(np.abs(got.astype(np.float64) - expected)))
                assert error <= bound, f"{model} {name}: max error {error:.3g} > {bound:.3g}"


@pytest.mark.parametrize("model", ZOO)
def test_text_and_proto_lower_to_the_same_program(model: str) -> None:
    """Each zoo model's .hlo and .hlo.pb become the same Penguin program, so what every --optlevel
    proves from the proto (above) holds for the text too; the text also runs end to end at -O2."""
    from ncc.tools.hlo.hlo_reader import load_module
    from ncc.tools.hlo2penguin.lower import lower_module

    programs = [lower_module(load_module(str(MODELS_DIR / f"{model}{suffix}")))
                for suffix in (".hlo.pb", ".hlo")]
    for program in programs:
        program.ClearField("name")
    proto, text = (program.SerializeToString(deterministic=True) for program in programs)
    assert proto == text
