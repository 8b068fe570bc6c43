"""The benchmarks (bench/run_scale.py, bench/run_bench.py) and bench/hlo_gen.py, at tiny sizes.

JAX is optional: the benchmark runs below hide it (XLA columns must read n/a), and only the tests
of the XLA:CPU timing itself need it (pytest.importorskip).
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

import numpy as np
import pytest
from orchestrator_support import ROOT, ncc

sys.path.insert(0, str(ROOT / "bench"))
import hlo_gen  # noqa: E402
import run_bench  # noqa: E402
import run_fusion  # noqa: E402
import run_scale  # noqa: E402
import run_sim  # noqa: E402
import run_suite  # noqa: E402

TINY = {
    "chain": {"n": 3, "rows": 128, "cols": 128},
    "mlp": {"batch": 128, "d": 128, "layers": 1},
    "attention": {"seq": 128, "d": 128, "layers": 1},
    "bdot": {"batch": 2, "m": 128, "k": 128, "n": 128},
}


@pytest.fixture
def without_jax(monkeypatch: pytest.MonkeyPatch) -> None:
    """`import jax` fails as if JAX were not installed."""
    for name in ("jax", "jax.numpy", "jaxlib"):
        monkeypatch.setitem(sys.modules, name, None)


def test_run_scale_reports_every_size_and_the_growth_exponent(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], without_jax: None
) -> None:
    out = tmp_path / "scale.json"
    sizes = "n=3,rows=128,cols=128; n=1,rows=12800000,cols=2048; n=6,rows=128,cols=128"
    code = run_scale.main(["--family", "chain", "--sizes", sizes, "--reps", "1", "--loops", "unrolled",
                           "--json", str(out)])
    assert code == 1  # the middle size is refused by the first job (unrolled: 1.6M instructions)
    printed = capsys.readouterr().out

    data = json.loads(out.read_text())
    small, refused, larger = data["results"]
    for row in (small, larger):
        assert row["error"] == ""
        assert row["bir_instructions"] > 0 and row["neff_instructions"] > 0
        assert row["compile_wall_s"] > 0 and row["walrus_wall_s"] > 0
        assert row["walrus_cpu_s"] == pytest.approx(row["walrus_user_s"] + row["walrus_sys_s"])
        assert row["walrus_peak_rss_bytes"] > 0
        assert {"pre_sched", "allocation", "codegen"} <= set(row["pass_wall_s"])
        assert row["xla_cpu_compile_s"] is None and row["ratio_to_xla"] is None
    assert larger["bir_instructions"] > small["bir_instructions"]
    assert refused["compile_wall_s"] is None and refused["error"].startswith("ncc: error: [E")

    growth = data["growth"]["chain unrolled"]
    assert growth["sizes"] == 2
    assert isinstance(growth["overall"], float)
    assert [step["exponent"] for step in growth["steps"]] == [pytest.approx(growth["overall"])]
    assert set(growth["passes"]) == set(small["pass_wall_s"])

    table = printed.splitlines()
    assert any(
        line.startswith("chain") and "n=1,rows=12800000" in line and "FAILED: ncc: error: [E" in line
        for line in table
    )
    assert any("n=6,rows=128,cols=128" in line and "n/a" in line for line in table)
    assert any(line.strip().startswith("chain unrolled: overall ") for line in table)


def test_a_compile_over_the_timeout_is_one_failed_row(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], without_jax: None
) -> None:
    out = tmp_path / "scale.json"
    args = ["--family", "chain", "--sizes", "n=3,rows=128,cols=128", "--timeout", "0.05", "--loops", "rolled",
            "--json", str(out)]
    assert run_scale.main(args) == 1
    (row,) = json.loads(out.read_text())["results"]
    assert row["compile_wall_s"] is None and "time limit" in row["error"]
    assert "FAILED: ncc: error: [F" in capsys.readouterr().out


def test_run_scale_sets_rolled_beside_unrolled(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], without_jax: None
) -> None:
    out = tmp_path / "scale.json"
    code = run_scale.main(["--family", "chain", "--sizes", "n=20,rows=1024,cols=512", "--reps", "1",
                           "--simulate", "--json", str(out)])
    assert code == 0
    rolled, unrolled = json.loads(out.read_text())["results"]
    assert (rolled["loops"], unrolled["loops"]) == ("rolled", "unrolled")
    assert rolled["executed_instructions"] > 0 and unrolled["executed_instructions"] > 0
    assert rolled["bir_instructions"] < unrolled["bir_instructions"]  # the frontend kept a loop
    assert rolled["simulated_ns"] > 0 and unrolled["simulated_ns"] > 0
    printed = capsys.readouterr().out
    assert "loops kept rolled against unrolled" in printed


def test_sizes_parse_in_hlo_gen_parameter_order() -> None:
    assert run_scale.parse_sizes("mlp", "256; d=64,batch=8") == [
        {"batch": 256, "d": 1024},
        {"batch": 8, "d": 64},
    ]
    assert run_scale.parse_sizes("attention", "3") == [{"seq": 512, "d": 512, "layers": 3}]
    with pytest.raises(ValueError):
        run_scale.parse_sizes("chain", "n=three")


def test_slope_is_the_log_log_exponent() -> None:
    assert run_scale.slope([(10, 1.0), (20, 4.0)]) == pytest.approx(2.0)
    assert run_scale.slope([(10, 3.0), (100, 30.0), (1000, 300.0)]) == pytest.approx(1.0)
    assert run_scale.slope([(10, 1.0)]) is None


@pytest.mark.parametrize("family", sorted(TINY))
def test_every_generated_family_compiles(tmp_path: Path, family: str) -> None:
    model = tmp_path / f"{family}.hlo"
    model.write_text(hlo_gen.hlo_text(family, **TINY[family]))
    neff = tmp_path / f"{family}.neff"
    result = ncc("compile", model, "--output", neff, "--workdir", tmp_path / "work", "--verbose", "0")
    assert result.returncode == 0, result.stderr
    assert neff.is_file()


def test_run_bench_xla_time_is_none_without_jax(without_jax: None) -> None:
    assert not run_bench.jax_installed()
    assert run_bench.xla_cpu_compile_time(run_bench.find_model("add_mul", None), 1) is None
    assert run_scale.xla_cpu_compile_time("chain", TINY["chain"], 1) is None


def test_xla_cpu_compile_time_is_measured_in_this_run(tmp_path: Path) -> None:
    pytest.importorskip("jax")
    # run_scale: the family's JAX twin through jax.jit(...).lower(...).compile()
    assert run_scale.xla_cpu_compile_time("chain", TINY["chain"], 2) > 0
    # run_bench: the bundled model's own HloModuleProto ...
    assert run_bench.xla_cpu_compile_time(run_bench.find_model("add_mul", None), 1) > 0
    # ... or, with only HLO text beside it, the text parsed by XLA
    text_only = tmp_path / "chain.hlo"
    text_only.write_text(hlo_gen.hlo_text("chain", **TINY["chain"]))
    assert run_bench.xla_cpu_compile_time(text_only, 1) > 0


def test_run_scale_repeats_the_compile_and_reports_the_median_run(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], without_jax: None
) -> None:
    out = tmp_path / "scale.json"
    code = run_scale.main(["--family", "chain", "--sizes", "n=2,rows=128,cols=128", "--reps", "1",
                           "--ncc-reps", "3", "--loops", "rolled", "--json", str(out)])
    assert code == 0
    (row,) = json.loads(out.read_text())["results"]
    runs = row["walrus_wall_runs"]
    assert len(runs) == 3 and row["walrus_wall_s"] == sorted(runs)[1]
    assert "walrus wall of every ncc compile" in capsys.readouterr().out


def test_run_sim_reports_every_size_the_growth_and_checks_the_outputs(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    out = tmp_path / "sim.json"
    code = run_sim.main(["--sizes", "600,1200", "--chain", "3", "--reps", "2", "--json", str(out)])
    assert code == 0
    data = json.loads(out.read_text())
    chain, small, larger = data["results"]
    assert chain["label"] == "chain n=3" and not chain["generated"] and chain["executed"] > 0
    for row in (small, larger):
        assert row["error"] == "" and len(row["runs"]) == 2 and row["peak_rss_bytes"] > 0
        assert row["wall_s"] >= row["simulate_s"] > 0 and row["us_per_instruction"] > 0
    assert small["executed"] < larger["executed"]
    assert isinstance(data["growth"]["wall_s"], float)
    assert "growth of wall with executed instructions" in capsys.readouterr().out


@pytest.mark.slow
def test_run_suite_compiles_verifies_and_compares_a_cut(tmp_path: Path) -> None:
    """bench/run_suite.py on the ViT cut: compiled with --verify, run on its committed inputs, the
    error against JAX's outputs measured and within tolerance, every job's wall recorded."""
    out = tmp_path / "suite.json"
    assert run_suite.main(["--cuts", "--models", "vit_block", "--json", str(out)]) == 0
    (result,) = json.loads(out.read_text())
    assert result["model"] == "vit_block_cut" and result["outcome"] == "ok" and result["verified"] == "yes"
    assert set(result["jobs"]) == {"HLOToTensorizer", "GoldenEvaluator", "Frontend", "WalrusDriver",
                                   "Packager", "NeffVerifier"}
    assert result["races"] == 0 and result["static_instructions"] <= result["executed_instructions"]
    assert 0 <= result["max_error"] <= result["tolerance"] and result["tolerance"] > 0  # a float output
    # the bounds beside it: the simulated run moved at least the minimum bytes, and took at least the
    # schedule's lower bound, which is at least the first-principles one
    assert result["hbm_bytes"] >= result["min_hbm_bytes"] > 0
    assert result["simulated_us"] >= result["lower_bound_us"] >= result["bound_us"] > 0
    assert result["busiest"].split()[0] in {"PE", "ACT", "POOL", "DVE", "SP"}


def test_the_first_principles_bound_counts_flops_at_the_dtypes_peak_and_the_minimum_bytes() -> None:
    """A bf16 dot [1024, 4096] x [4096, 1024] (PE peak) and the same in f32 (a quarter of it), and an
    add whose parameters and output are its only traffic."""
    from first_principles import first_principles

    from ncc.tools.hlo.hlo_text import parse_hlo_text
    from ncc.tools.target import load_target

    target = load_target("trn1")
    flops = 2 * 1024 * 4096 * 1024
    peak = 2 * 128 * 128 * 2.8 / 1e3  # TFLOP/s (= FLOP/ps): 91.75
    for dtype, rate in (("bf16", peak), ("f32", peak / 4)):
        text = (f"HloModule d\nENTRY e {{\n  a = {dtype}[1024,4096] parameter(0)\n"
                f"  b = {dtype}[4096,1024] parameter(1)\n  ROOT c = f32[1024,1024] dot(a, b), "
                "lhs_contracting_dims={1}, rhs_contracting_dims={0}\n}\n")
        bound = first_principles(parse_hlo_text(text), target)
        assert (bound.fast_flops, bound.fp32_flops) == ((flops, 0) if dtype == "bf16" else (0, flops))
        assert bound.pe_ns == pytest.approx(flops / rate / 1e3) and bound.bound_by == "PE"
    add = first_principles(parse_hlo_text(
        "HloModule a\nENTRY e {\n  x = f32[1024,1024] parameter(0)\n  y = f32[1024,1024] parameter(1)\n"
        "  ROOT z = f32[1024,1024] add(x, y)\n}\n"), target)
    assert add.min_hbm_bytes == 3 * 4 * 2**20 and add.bound_by == "HBM"
    assert add.ns == pytest.approx(3 * 4 * 2**20 / 410)


def test_run_suite_names_the_diagnostic_that_stopped_a_compile() -> None:
    refused = "ncc: warning: x\nncc: error: [E305] job GoldenEvaluator: too large to verify"
    assert run_suite.diagnostic_code(refused) == "E305"
    assert run_suite.diagnostic_code("Traceback (most recent call last):") == "error"


def test_the_order_bound_of_a_simulated_schedule_is_below_its_makespan(tmp_path: Path) -> None:
    """bench/run_fusion.py's order bound (first transfer in + busiest engine + one transfer out)
    is a lower bound of every order, the simulated one included; on the pipelining fixture the
    list schedule is close to it."""
    fixture = ROOT / "tests" / "data" / "pipelined_chain"
    neff, inputs, trace, report = (tmp_path / n for n in ("m.neff", "in.npz", "t.json", "r.json"))
    assert ncc("compile", fixture.with_suffix(".hlo.pb"), "-o", neff).returncode == 0
    with np.load(fixture.with_suffix(".io.npz")) as data:
        np.savez(inputs, arg0=data["arg0"])
    output = tmp_path / "o.npz"
    run = ncc("run", neff, "--inputs", inputs, "--output", output, "--trace", trace, "--report", report)
    assert run.returncode == 0, run.stderr
    simulated = json.loads(report.read_text())["simulated_ns"]
    bound = run_fusion.order_bound_ns(trace)
    assert 0.5 * simulated < bound <= simulated
