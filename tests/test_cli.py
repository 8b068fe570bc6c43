"""The `ncc` command line on bad input: one diagnostic line with a code, the documented exit code,
no traceback and nothing half-written. End-to-end `ncc run` / `ncc inspect` are marked slow."""

from __future__ import annotations

import json
import subprocess
import sys
import zipfile
from pathlib import Path

import numpy as np
import pytest
from orchestrator_support import assert_one_line_error, find_model, lock_held, ncc, write_tiny_neff


@pytest.fixture
def model() -> Path:
    return find_model("add_mul.hlo")


def test_help_is_instant_and_lists_every_command() -> None:
    code = (
        "import sys\n"
        "from ncc.orchestrator import cli\n"
        "assert cli.main(['--help']) == 0\n"
        "heavy = [m for m in ('luigi', 'numpy', 'psutil', 'google.protobuf') if m in sys.modules]\n"
        "assert not heavy, heavy\n"
    )
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True)
    assert proc.returncode == 0, proc.stderr
    for command in ("compile", "run", "inspect"):
        assert f"  {command} " in proc.stdout


def test_subcommand_help_exits_zero() -> None:
    result = ncc("compile", "--help")
    assert result.returncode == 0
    assert "--walrus-passes" in result.stdout and "--mem-limit" in result.stdout


def test_version() -> None:
    result = ncc("--version")
    assert result.returncode == 0 and result.stdout.startswith("ncc ")


def test_unknown_command_suggests_the_closest() -> None:
    result = ncc("compil", "x.hlo")
    line = assert_one_line_error(result, "U002")
    assert result.returncode == 2
    assert "did you mean 'compile'?" in line


def test_no_command_is_a_usage_error() -> None:
    result = ncc()
    assert_one_line_error(result, "U002")
    assert result.returncode == 2


def test_missing_model_is_u001_and_creates_nothing(tmp_path: Path) -> None:
    result = ncc("compile", tmp_path / "nope.hlo", "--output", tmp_path / "out.neff")
    line = assert_one_line_error(result, "U001")
    assert result.returncode == 2 and "nope.hlo" in line
    assert list(tmp_path.iterdir()) == []


def test_model_that_is_a_directory_is_u001(tmp_path: Path) -> None:
    result = ncc("compile", tmp_path, "--output", tmp_path / "out.neff")
    assert_one_line_error(result, "U001")


def test_missing_output_directory_is_u004(tmp_path: Path, model: Path) -> None:
    result = ncc("compile", model, "--output", tmp_path / "no" / "such" / "out.neff")
    line = assert_one_line_error(result, "U004")
    assert result.returncode == 2 and str(tmp_path / "no" / "such") in line
    assert list(tmp_path.iterdir()) == []


def test_output_that_is_a_directory_is_a_usage_error(tmp_path: Path, model: Path) -> None:
    result = ncc("compile", model, "--output", tmp_path, "--workdir", tmp_path / "w")
    assert_one_line_error(result, "U002")
    assert result.returncode == 2


def test_output_that_is_the_model_is_refused_and_the_model_kept(tmp_path: Path, model: Path) -> None:
    copy = tmp_path / "m.hlo"
    copy.write_bytes(model.read_bytes())
    result = ncc("compile", copy, "--output", copy)
    assert_one_line_error(result, "U002")
    assert result.returncode == 2 and copy.read_bytes() == model.read_bytes()


def test_output_that_is_the_verify_inputs_is_refused_and_the_inputs_kept(tmp_path: Path, model: Path) -> None:
    inputs = tmp_path / "in.npz"
    inputs.write_bytes(model.with_name(model.name.split(".")[0] + ".io.npz").read_bytes())
    before = inputs.read_bytes()
    result = ncc("compile", model, "--output", inputs, "--verify-inputs", inputs)
    assert "is the --verify-inputs file" in assert_one_line_error(result, "U002")
    assert result.returncode == 2 and inputs.read_bytes() == before


def test_unwritable_output_directory_is_u005(tmp_path: Path, model: Path) -> None:
    result = ncc("compile", model, "--output", "/proc/out.neff", "--workdir", tmp_path / "w")
    assert_one_line_error(result, "U005")
    assert result.returncode == 3
    assert not (tmp_path / "w").exists()


@pytest.mark.parametrize("workdir", ["/proc/ncc-test-workdir", "{tmp}/a_file/sub"])
def test_unusable_work_dir_is_u003(tmp_path: Path, model: Path, workdir: str) -> None:
    (tmp_path / "a_file").write_text("not a directory")
    workdir = workdir.format(tmp=tmp_path)
    result = ncc("compile", model, "--output", tmp_path / "out.neff", "--workdir", workdir)
    line = assert_one_line_error(result, "U003")
    assert result.returncode == 3 and workdir in line
    assert not (tmp_path / "out.neff").exists()


@pytest.mark.parametrize(
    ("flags", "words"),
    [
        (["--optlevel", "7"], "--optlevel"),
        (["--optlevel", "two"], "--optlevel"),
        (["-O4"], "-O"),
        (["--walrus-passes", "a,,b"], "--walrus-passes"),
        (["--walrus-passes", "pre sched"], "--walrus-passes"),
        (["--timeout", "-1"], "--timeout"),
        (["--timeout", "soon"], "--timeout"),
        (["--mem-limit", "0"], "--mem-limit"),
        (["--bogus"], "--bogus"),
    ],
)
def test_bad_flags_are_u002_and_create_nothing(
    tmp_path: Path, model: Path, flags: list[str], words: str
) -> None:
    result = ncc("compile", model, "--output", tmp_path / "out.neff", *flags)
    line = assert_one_line_error(result, "U002")
    assert result.returncode == 2 and words in line
    assert list(tmp_path.iterdir()) == []


def test_dash_o_is_the_optimization_level_as_other_compilers_spell_it(tmp_path: Path, model: Path) -> None:
    short = ncc("compile", model, "--output", tmp_path / "short.neff", "-O0")
    long = ncc("compile", model, "--output", tmp_path / "long.neff", "--optlevel", "0")
    default = ncc("compile", model, "--output", tmp_path / "default.neff")
    assert short.returncode == long.returncode == default.returncode == 0, short.stderr
    assert (tmp_path / "short.neff").read_bytes() == (tmp_path / "long.neff").read_bytes()
    assert (tmp_path / "short.neff").read_bytes() != (tmp_path / "default.neff").read_bytes()


def test_missing_output_flag_is_u002(model: Path) -> None:
    result = ncc("compile", model)
    line = assert_one_line_error(result, "U002")
    assert "--output" in line


def test_busy_work_dir_is_u006(tmp_path: Path, model: Path) -> None:
    workdir = tmp_path / "w"
    workdir.mkdir()
    with lock_held(workdir, "777"):
        result = ncc("compile", model, "--output", tmp_path / "out.neff", "--workdir", workdir)
    line = assert_one_line_error(result, "U006")
    assert result.returncode == 3 and "pid 777" in line


def test_run_and_inspect_missing_neff_are_u001(tmp_path: Path) -> None:
    inputs = tmp_path / "in.npz"
    np.savez(inputs, arg0=np.zeros(3))
    result = ncc("run", tmp_path / "no.neff", "--inputs", inputs, "--output", tmp_path / "o.npz")
    assert_one_line_error(result, "U001")
    assert result.returncode == 2
    result = ncc("inspect", tmp_path / "no.neff")
    assert_one_line_error(result, "U001")


def test_inspect_of_a_non_neff_is_the_readers_diagnostic(tmp_path: Path) -> None:
    bogus = tmp_path / "bogus.neff"
    bogus.write_bytes(b"definitely not a NEFF file, just some bytes")
    result = ncc("inspect", bogus)
    line = assert_one_line_error(result, "E502")
    assert result.returncode == 1 and "bogus.neff" in line


def _bad_member(path: Path) -> None:
    with zipfile.ZipFile(path, "w") as archive:
        archive.writestr("arg0.npy", b"garbage")


@pytest.mark.parametrize("name, write, why", [
    ("in.npz", lambda p: p.write_text("not a zip"), "as an .npz file: it is not a zip archive of arrays"),
    ("in.npy", lambda p: np.save(p, np.zeros(3, np.float32)), "one array (.npy)"),
    ("in.npz", lambda p: np.savez(p, arg0=np.ones(3, np.complex64)), "complex64 values"),
    ("in.npz", lambda p: np.savez(p, arg0=np.array(["1.5"])), "<U3 values"),
    ("in.npz", _bad_member, "member 'arg0' is not a numpy array"),
    ("in.npz", lambda p: np.savez(p, arg0=np.array([{}], object)), "pickled Python objects, which ncc never"),
], ids=["not-a-zip", "npy", "complex", "strings", "bad-member", "pickled"])
def test_run_with_unreadable_inputs_is_u008(tmp_path: Path, name: str, write, why: str) -> None:
    """Inputs ncc run cannot take: one coded line saying why (a .npy crashed it, a complex input
    lost its imaginary part with numpy's warning, a garbage member was an input of shape [])."""
    neff = tmp_path / "m.neff"
    neff.write_bytes(b"x")
    bad = tmp_path / name
    write(bad)
    result = ncc("run", neff, "--inputs", bad, "--output", tmp_path / "o.npz")
    line = assert_one_line_error(result, "U008")
    assert result.returncode == 2 and why in line


@pytest.mark.parametrize("array, why", [
    (np.ones(4, np.complex64), "complex64 values"),
    (np.array([{}], object), "pickled Python objects"),
], ids=["complex", "pickled"])
def test_compile_refuses_the_verify_inputs_run_refuses(tmp_path: Path, model: Path, array, why: str) -> None:
    bad = tmp_path / "in.npz"
    np.savez(bad, arg0=array)
    result = ncc("compile", model, "--output", tmp_path / "o.neff", "--verify-inputs", bad)
    assert why in assert_one_line_error(result, "U008")
    assert not (tmp_path / "o.neff").exists() and not (tmp_path / "o.ncc-work").exists()


def test_compile_warns_of_verify_inputs_it_ignores(tmp_path: Path, model: Path) -> None:
    inputs = tmp_path / "in.npz"
    with np.load(model.with_name("add_mul.io.npz")) as data:
        np.savez(inputs, **data, bias=np.ones(2, np.float32))
    result = ncc("compile", model, "--output", tmp_path / "o.neff", "--verify-inputs", inputs)
    assert result.returncode == 0, result.stderr
    assert f"ncc: warning: {inputs} holds arrays that are not argN or outN, ignored: bias" in result.stderr


def test_run_warns_of_integer_inputs_the_conversion_changes(tmp_path: Path) -> None:
    """bit_hash takes a u32 array: fractions, NaN and values out of range were converted without
    a word (XLA's rules: truncated, NaN to 0, wrapped); exact values say nothing."""
    model = find_model("bit_hash.hlo")
    neff = tmp_path / "m.neff"
    assert ncc("compile", model, "--output", neff).returncode == 0
    with np.load(model.with_name("bit_hash.io.npz")) as data:
        given = {name: data[name] for name in data.files if name.startswith("arg")}
    (unsigned,) = [name for name, array in given.items() if array.dtype == np.uint32]
    shape = given[unsigned].shape
    cases = [
        (given[unsigned].astype(np.int64), ""),
        (np.full(shape, 0.5, np.float32), "fractional values"),
        (np.full(shape, np.nan, np.float32), "NaN or infinite values"),
        (np.full(shape, -1, np.int64), "values out of u32's range"),
    ]
    for array, words in cases:
        np.savez(tmp_path / "in.npz", **{**given, unsigned: array})
        result = ncc("run", neff, "--inputs", tmp_path / "in.npz", "--output", tmp_path / "o.npz")
        assert result.returncode == 0, result.stderr
        assert (f"ncc: warning: input {unsigned} ({array.dtype}) has {words}" in result.stderr) == bool(words)
        assert bool(words) == ("warning" in result.stderr), result.stderr


# -- end to end: compile, run, inspect ------------------------------------------------------------


@pytest.mark.slow
@pytest.mark.skipif(not Path("/dev/full").exists(), reason="needs /dev/full")
def test_inspect_into_a_full_device_is_u011_not_an_internal_error(tmp_path: Path, model: Path) -> None:
    neff = tmp_path / "m.neff"
    assert ncc("compile", model, "--output", neff).returncode == 0
    with open("/dev/full", "w") as full:
        proc = subprocess.run(
            [sys.executable, "-m", "ncc.orchestrator", "inspect", str(neff)],
            stdout=full, stderr=subprocess.PIPE, text=True,
        )
    assert proc.returncode == 3 and "Traceback" not in proc.stderr
    assert proc.stderr.strip() == "ncc: error: [U011] cannot write standard output: No space left on device"


def test_compile_run_inspect_add_mul(tmp_path: Path, model: Path) -> None:
    neff = tmp_path / "add_mul.neff"
    result = ncc("compile", model, "--output", neff)
    assert result.returncode == 0, result.stderr
    assert "Traceback" not in result.stderr
    assert (tmp_path / "add_mul.ncc-work" / "pipeline.json").is_file()  # the default work dir
    assert neff.is_file() and not [p for p in tmp_path.iterdir() if p.name.endswith(".tmp")]

    io = find_model("add_mul.io.npz")
    report = tmp_path / "report.json"
    result = ncc("run", neff, "--inputs", io, "--output", tmp_path / "out.npz", "--report", report)
    assert result.returncode == 0, result.stderr
    assert "simulated time" in result.stdout
    with np.load(tmp_path / "out.npz") as outputs, np.load(io) as expected:
        np.testing.assert_allclose(outputs["out0"], expected["out0"], rtol=1e-5, atol=1e-5)
    data = json.loads(report.read_text())
    assert data["simulated_ns"] > 0 and data["races"] == [] and data["deadlock"] is None
    assert data["metadata"]["compiler"] == "ncc" and len(data["neff_sha256"]) == 64
    assert data["unreset_semaphores"] == {}

    # The runtime serves inference after inference: the semaphore reset makes the second one right.
    result = ncc("run", neff, "--inputs", io, "--output", tmp_path / "out2.npz", "--inferences", "3")
    assert result.returncode == 0, result.stderr
    with np.load(tmp_path / "out2.npz") as outputs, np.load(io) as expected:
        np.testing.assert_allclose(outputs["out0"], expected["out0"], rtol=1e-5, atol=1e-5)

    result = ncc("inspect", neff)
    assert result.returncode == 0, result.stderr
    for heading in ("engines:", "semaphores", "HBM tensors:", "metadata:"):
        assert heading in result.stdout
    result = ncc("inspect", neff, "--json")
    info = json.loads(result.stdout)
    assert info["instructions"] == sum(engine["instructions"] for engine in info["engines"]) > 0
    assert {tensor["role"] for tensor in info["hbm"]} >= {"INPUT", "OUTPUT"}


def test_run_compares_nan_and_infinities_with_the_reference_as_equal(tmp_path: Path, model: Path) -> None:
    """x * y + x with NaN and infinities in x: where the reference holds the same NaN or infinity
    the error is 0 (it was reported as nan, with numpy's warning); a wrong NaN is an inf error."""
    neff = tmp_path / "add_mul.neff"
    assert ncc("compile", model, "--output", neff).returncode == 0
    rng = np.random.default_rng(5)
    x, y = (rng.standard_normal((128, 512)).astype(np.float32) for _ in range(2))
    x[0, :3] = [np.nan, np.inf, -np.inf]
    y[0, 1:3] = 1.0
    with np.errstate(all="ignore"):
        expected = x * y + x
    report, out = tmp_path / "report.json", tmp_path / "out.npz"
    np.savez(tmp_path / "same.npz", arg0=x, arg1=y, out0=expected)
    result = ncc("run", neff, "--inputs", tmp_path / "same.npz", "--output", out, "--report", report)
    assert result.returncode == 0 and "Warning" not in result.stderr, result.stderr
    assert "out0: max |error| vs the reference in same.npz: 0" in result.stdout
    assert json.loads(report.read_text())["reference_comparison"][0]["max_abs_error"] == 0.0
    expected[0, 0] = 1.0  # the program's NaN is now wrong
    np.savez(tmp_path / "wrong.npz", arg0=x, arg1=y, out0=expected)
    ncc("run", neff, "--inputs", tmp_path / "wrong.npz", "--output", out, "--report", report)
    assert json.loads(report.read_text())["reference_comparison"][0]["max_abs_error"] == float("inf")
    np.savez(tmp_path / "shape.npz", arg0=x, arg1=y, out0=expected[:5])  # a reference of another shape
    result = ncc("run", neff, "--inputs", tmp_path / "shape.npz", "--output", out)
    assert "out0: not compared with the reference in shape.npz: shape [128, 512] but expected [5, 512]" \
        in result.stdout


@pytest.mark.slow
def test_compile_error_in_the_input_is_the_tools_diagnostic(tmp_path: Path) -> None:
    broken = tmp_path / "broken.hlo"
    broken.write_text("HloModule broken\n\nENTRY main {\n  x = f32[4]{0} parameter(0\n}\n")
    result = ncc("compile", broken, "--output", tmp_path / "broken.neff")
    line = assert_one_line_error(result, "E103")
    assert result.returncode == 1
    workdir = tmp_path / "broken.ncc-work"
    assert "job HLOToTensorizer" in line and f"work dir {workdir}" in line
    assert f"see {workdir}/01_HLOToTensorizer/stderr.log" in line
    assert not (tmp_path / "broken.neff").exists()


@pytest.mark.slow
def test_truncated_hlo_proto_is_a_tool_diagnostic(tmp_path: Path) -> None:
    whole = find_model("add_mul.hlo.pb").read_bytes()
    truncated = tmp_path / "cut.hlo.pb"
    truncated.write_bytes(whole[: len(whole) // 2])
    result = ncc("compile", truncated, "--output", tmp_path / "cut.neff")
    line = assert_one_line_error(result, "E102")
    assert result.returncode == 1 and "job HLOToTensorizer" in line


@pytest.mark.slow
def test_unknown_walrus_pass_is_the_backends_diagnostic(tmp_path: Path, model: Path) -> None:
    result = ncc("compile", model, "--output", tmp_path / "m.neff", "--walrus-passes", "no_such_pass")
    line = assert_one_line_error(result, "E401")
    assert result.returncode == 1 and "job WalrusDriver" in line and "no_such_pass" in line


# -- `ncc run` checks on hand-made NEFFs ------------------------------------------------------------


@pytest.mark.parametrize(
    ("kind", "code", "words"), [("race", "R001", "data race"), ("deadlock", "R002", "deadlock")]
)
def test_run_reports_races_and_deadlocks_after_writing_its_results(
    tmp_path: Path, kind: str, code: str, words: str
) -> None:
    neff = write_tiny_neff(tmp_path / f"{kind}.neff", kind)
    inputs = tmp_path / "in.npz"
    np.savez(inputs, arg0=np.arange(4, dtype=np.float32))
    report = tmp_path / "report.json"
    result = ncc("run", neff, "--inputs", inputs, "--output", tmp_path / "out.npz", "--report", report)
    line = assert_one_line_error(result, code)
    assert result.returncode == 5 and words in line and line.endswith(f"see {report}")
    assert (tmp_path / "out.npz").is_file() and json.loads(report.read_text())["simulated_ns"] > 0


def test_run_reports_semaphores_left_unreset_and_the_second_inference_races(tmp_path: Path) -> None:
    neff = write_tiny_neff(tmp_path / "unreset.neff", "unreset")
    inputs = tmp_path / "in.npz"
    np.savez(inputs, arg0=np.arange(4, dtype=np.float32))
    once = ncc("run", neff, "--inputs", inputs, "--output", tmp_path / "out.npz")
    line = assert_one_line_error(once, "R003")
    assert once.returncode == 5 and "s0=1" in line
    twice = ncc("run", neff, "--inputs", inputs, "--output", tmp_path / "out.npz", "--inferences", "2")
    assert_one_line_error(twice, "R001")
    bad = ncc("run", neff, "--inputs", inputs, "--output", tmp_path / "out.npz", "--inferences", "0")
    assert bad.returncode == 2 and "--inferences" in bad.stderr and "Traceback" not in bad.stderr


def test_run_with_inputs_that_do_not_match_is_the_simulators_diagnostic(tmp_path: Path) -> None:
    neff = write_tiny_neff(tmp_path / "m.neff", "race")
    inputs = tmp_path / "in.npz"
    np.savez(inputs, arg5=np.zeros(4, dtype=np.float32))
    result = ncc("run", neff, "--inputs", inputs, "--output", tmp_path / "out.npz")
    line = assert_one_line_error(result, "E602")
    assert result.returncode == 1 and "arg0" in line
    assert "ignored: arg5" in result.stderr  # the array the NEFF does not take is named, not dropped silently
    assert not (tmp_path / "out.npz").exists()
