"""`ncc reduce`: delta debugging of HLO modules, with a test script or a failed work dir.

The end-to-end tests run the real CLI. The planted crash is real (NCC_FAULT_INJECT makes
walrus_driver segfault as `allocation` starts in modules where a divide consumes an exponential)
and `ncc reduce` runs *without* the variable: the crash reproduces only because the reducer
replays the failed compile's recorded environment. The script test logs every candidate it is
given, and this file verifies each of them with ncc's verifier itself.
"""

from __future__ import annotations

import json
import os
import re
import signal
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import pytest
from orchestrator_support import Result, assert_one_line_error, find_model, ncc

from ncc.orchestrator.triage.reduce_edits import EDITS, cut, drop_outputs, instruction_count, merge, normalize
from ncc.tools.hlo.hlo_printer import print_module
from ncc.tools.hlo.hlo_reader import load_module
from ncc.tools.hlo.hlo_text import parse_hlo_text
from ncc.tools.hlo.hlo_verify import verify_module

PLANTED = "walrus_driver:segv@pass=allocation@op=divide(exponential)"

# Interesting while an `exponential`'s result feeds a `divide` (read from the text alone, as in
# test_triage); every file it is given is copied into $REDUCE_LOG, and $REDUCE_SLEEP slows it.
KEEP_EXP_DIVIDE = """\
#!{python}
import os, re, shutil, sys, time, uuid
path = sys.argv[1]
if os.environ.get("REDUCE_LOG"):
    shutil.copy(path, os.path.join(os.environ["REDUCE_LOG"], uuid.uuid4().hex + ".hlo"))
time.sleep(float(os.environ.get("REDUCE_SLEEP", "0")))
opcode, operands = {{}}, {{}}
for line in open(path).read().splitlines():
    m = re.match(r"\\s*(?:ROOT\\s+)?([\\w.\\-]+)\\s*=\\s*\\S+?(?:\\{{[^}}]*\\}})?\\s+([\\w-]+)"
                 r"\\(([^)]*)\\)", line)
    if m:
        opcode[m[1]] = m[2]
        operands[m[1]] = [w.strip() for w in m[3].split(",")]
sys.exit(0 if any(opcode[n] == "divide" and any(opcode.get(a) == "exponential" for a in operands[n])
                  for n in opcode) else 1)
"""


def keep_script(folder: Path) -> Path:
    script = folder / "keep.py"
    script.write_text(KEEP_EXP_DIVIDE.format(python=sys.executable))
    script.chmod(0o755)
    return script


def interesting(script: Path, hlo: Path) -> bool:
    return subprocess.run([str(script), str(hlo)], env={**os.environ, "REDUCE_LOG": ""}).returncode == 0


def assert_no_scratch(folder: Path) -> None:
    assert not list(folder.glob(".ncc-reduce-*")), "the scratch folder was left behind"
    assert not list(folder.glob(".*.tmp")), "a temporary output was left behind"


# -- the edits, on small modules ------------------------------------------------------------------

CHAIN = """HloModule chain

add {
  a = f32[] parameter(0)
  b = f32[] parameter(1)
  ROOT s = f32[] add(a, b)
}

ENTRY main {
  x = f32[8,16] parameter(0)
  y = f32[8,16] parameter(1)
  e = f32[8,16] exponential(x)
  n = f32[8,16] negate(y)
  d = f32[8,16] divide(e, n)
  z = f32[] constant(0)
  r = f32[8] reduce(d, z), dimensions={1}, to_apply=add
  ROOT t = f32[8] tanh(r)
}
"""


def names(module) -> list[str]:
    return [i.name for c in module.computations for i in c.instructions]


def targets_named(module, wanted: set[str]):
    edit = EDITS[0]
    return [t for t in edit.targets(module) if t.name in wanted]


def test_removing_an_instruction_makes_it_a_parameter_and_keeps_what_fed_it() -> None:
    module = parse_hlo_text(CHAIN)
    made = cut(module, targets_named(module, {"n"}))
    assert normalize(made)
    entry = made.computations[-1]
    by_name = {i.name: i for i in entry.instructions}
    assert by_name["n"].opcode == "parameter" and "y" not in by_name  # y fed only n
    verify_module(made)
    # Removing the root hands its place in the result to its operands.
    made = cut(module, targets_named(module, {"t", "r"}))
    assert normalize(made)
    entry = made.computations[-1]
    root = next(i for i in entry.instructions if i.id == entry.root_id)
    assert root.name == "d" and len(made.computations) == 1  # the reducer computation is gone
    verify_module(made)
    assert instruction_count(made) == 5  # x, y, e, n, d


def test_removing_a_chunk_keeps_whatever_computed_it_as_outputs() -> None:
    module = parse_hlo_text(CHAIN)
    made = cut(module, targets_named(module, {"d"}))  # e and n lose their only user
    assert normalize(made)
    entry = made.computations[-1]
    root = next(i for i in entry.instructions if i.id == entry.root_id)
    outputs = {i.id: i.name for i in entry.instructions}
    assert root.opcode == "tuple" and [outputs[o] for o in root.operand_ids] == ["t", "e", "n"]
    verify_module(made)
    dropped = drop_outputs(made, [t for t in EDITS[1].targets(made) if t.name in ("t", "n")])
    assert normalize(dropped)
    assert sorted(names(dropped)) == ["e", "x"]
    verify_module(dropped)


def test_merge_and_shapes() -> None:
    module = parse_hlo_text(CHAIN)
    entry = module.computations[-1]
    by_name = {i.name: i.id for i in entry.instructions}
    merged = merge(module, entry.id, by_name["n"], by_name["y"])  # bypass the negate
    assert normalize(merged) and "n" not in names(merged)
    verify_module(merged)
    assert merge(module, entry.id, by_name["x"], by_name["e"]) is None  # e is computed from x
    shapes = EDITS[3]
    made = shapes.make(module, [t for t in shapes.targets(module) if t.name == "16 -> 1"])
    assert made is not None and "f32[8,1]" in print_module(made.module)
    verify_module(made.module)


def test_every_first_round_candidate_of_the_models_is_a_module() -> None:
    """Each edit's candidates are well formed (ids, order, shapes of the program), whether or not
    the verifier then accepts what the edit did to the semantics."""
    for name in ("block.hlo", "softmax.hlo"):
        module = load_module(str(find_model(name)))
        for edit in EDITS:
            targets = edit.targets(module)
            for chunk in [targets[:1], targets[: len(targets) // 2], targets[len(targets) // 2 :]]:
                made = edit.make(module, chunk) if chunk else None
                if made is None:
                    continue
                text = print_module(made.module)
                assert parse_hlo_text(text).computations[-1].name == made.module.entry_computation_name
                assert made.size <= instruction_count(module)


# -- with a test script ---------------------------------------------------------------------------


@pytest.mark.slow
def test_a_script_keeping_exp_into_divide_reduces_block_to_six_or_fewer_valid_modules(tmp_path: Path) -> None:
    model = find_model("block.hlo")
    script = keep_script(tmp_path)
    log = tmp_path / "log"
    log.mkdir()
    out = tmp_path / "reduced.hlo"
    result = ncc("reduce", model, "--test", script, "--output", out, "--json", env={"REDUCE_LOG": str(log)})
    assert result.returncode == 0, result.stderr
    report = json.loads(result.stdout)
    assert report["instructions_before"] == 111
    assert report["instructions_after"] <= 6
    assert report["steps"] and report["tried"] >= len(report["steps"])
    assert "step 1:" in result.stderr  # progress goes to stderr under --json
    reduced = load_module(str(out))
    verify_module(reduced)
    assert instruction_count(reduced) == report["instructions_after"]
    assert print_module(load_module(str(tmp_path / "reduced.hlo.pb"))) == out.read_text()  # the same module
    assert interesting(script, out)
    # Every module the script was given (the original and each candidate tried) is valid.
    seen = sorted(log.iterdir())
    assert len(seen) >= 1 + report["tried"]
    for path in seen:
        verify_module(load_module(str(path)))
    assert_no_scratch(tmp_path)


@pytest.mark.slow
def test_the_result_does_not_depend_on_how_many_candidates_run_at_once(tmp_path: Path) -> None:
    model = find_model("softmax.hlo")
    script = keep_script(tmp_path)
    texts = []
    for jobs in ("1", "2"):
        out = tmp_path / f"softmax.{jobs}.hlo"
        result = ncc("reduce", model, "--test", script, "--output", out, "--jobs", jobs)
        assert result.returncode == 0, result.stderr
        summary = r"ncc reduce: 22 -> \d+ instructions, 3 -> 1 computations, in \d+ steps"
        assert re.search(summary, result.stdout), result.stdout
        texts.append(out.read_text())
    assert texts[0] == texts[1]
    assert instruction_count(parse_hlo_text(texts[0])) <= 6


@pytest.mark.slow
@pytest.mark.parametrize("stop", [signal.SIGINT, signal.SIGTERM, signal.SIGHUP])
def test_ctrl_c_writes_the_smallest_module_so_far_and_stops_every_test(tmp_path: Path, stop: int) -> None:
    """Ctrl-C, and SIGTERM or SIGHUP alike (a job scheduler's stop, a closed terminal)."""
    model = find_model("block.hlo")
    script = keep_script(tmp_path)
    out = tmp_path / "reduced.hlo"
    proc = subprocess.Popen(
        [sys.executable, "-m", "ncc.orchestrator", "reduce", model, "--test", script, "--output", out],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        env={**os.environ, "REDUCE_SLEEP": "0.3"},
    )
    deadline = time.monotonic() + 60
    lines = []
    while time.monotonic() < deadline:
        line = proc.stdout.readline()
        lines.append(line)
        if line.startswith("step 2:"):
            break
    proc.send_signal(stop)
    stdout, stderr = proc.communicate(timeout=30)
    assert proc.returncode == 130, stderr
    line = assert_one_line_error(Result(proc.returncode, stdout, stderr), "U007")
    assert "the smallest interesting module so far" in line
    assert stop == signal.SIGINT or f"stopped by {signal.Signals(stop).name}" in line
    reduced = load_module(str(out))
    verify_module(reduced)
    assert instruction_count(reduced) < 111 and interesting(script, out)
    assert_no_scratch(tmp_path)
    time.sleep(0.5)
    leftover = subprocess.run(["pgrep", "-f", str(script)], capture_output=True, text=True).stdout.split()
    assert not leftover, "a test script outlived ncc reduce"


# -- with a failed work dir: the planted crash ----------------------------------------------------


@pytest.fixture(scope="module")
def crashed_block(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A work dir where compiling `block` segfaulted in allocation (the planted crash)."""
    folder = tmp_path_factory.mktemp("crash")
    workdir = folder / "block.ncc-work"
    result = ncc(
        "compile", find_model("block.hlo"), "--output", folder / "block.neff", "--workdir", workdir,
        "--timeout", "300", env={"NCC_FAULT_INJECT": PLANTED},
    )
    assert result.returncode == 4 and "[F139] job WalrusDriver" in result.stderr, result.stderr
    return workdir


def signature(workdir: Path) -> str:
    result = ncc("triage", workdir, "--json")
    assert result.returncode == 0, result.stderr
    (failure,) = json.loads(result.stdout)["failures"]
    return failure["signature"]


@pytest.mark.slow
def test_a_planted_crash_reduces_block_to_five_or_fewer_instructions_that_crash_the_same_way(
    tmp_path: Path, crashed_block: Path
) -> None:
    out = tmp_path / "crash.hlo"
    result = ncc("reduce", find_model("block.hlo"), "--workdir", crashed_block, "--job", "WalrusDriver",
                 "--output", out, timeout=900)  # NCC_FAULT_INJECT is not set here
    assert result.returncode == 0, result.stderr
    assert "pass allocation" in result.stdout and "NCC_FAULT_INJECT=" in result.stdout
    match = re.search(r"ncc reduce: 111 -> (\d+) instructions", result.stdout)
    assert match and int(match[1]) <= 5, result.stdout
    expected = signature(crashed_block)
    for reduced in (out, tmp_path / "crash.hlo.pb"):
        module = load_module(str(reduced))
        verify_module(module)
        assert instruction_count(module) == int(match[1])
        workdir = tmp_path / f"{reduced.name}.work"
        again = ncc("compile", reduced, "--output", tmp_path / "x.neff", "--workdir", workdir,
                    env={"NCC_FAULT_INJECT": PLANTED})
        assert again.returncode == 4 and "[F139] job WalrusDriver" in again.stderr, again.stderr
        assert signature(workdir) == expected
    # Without the planted fault the reduced module compiles: the crash is the planted one.
    clean = ncc("compile", out, "--output", tmp_path / "clean.neff", "--workdir", tmp_path / "clean")
    assert clean.returncode == 0, clean.stderr
    assert_no_scratch(tmp_path)


@pytest.mark.slow
def test_a_module_that_does_not_fail_like_the_work_dir_is_u017(tmp_path: Path, crashed_block: Path) -> None:
    out = tmp_path / "gelu.hlo"
    result = ncc("reduce", find_model("gelu.hlo"), "--workdir", crashed_block, "--output", out)
    line = assert_one_line_error(result, "U017")
    assert "not interesting to begin with: the compile succeeded" in line
    assert not out.exists() and not (tmp_path / "gelu.hlo.pb").exists()
    assert_no_scratch(tmp_path)


# -- bad input: one line, a U-code, nothing written -----------------------------------------------


def test_bad_input_is_one_line_with_a_u_code_and_writes_nothing(tmp_path: Path) -> None:
    model = find_model("softmax.hlo")
    script = keep_script(tmp_path)
    out = tmp_path / "out.hlo"
    plain = tmp_path / "plain.py"
    plain.write_text("print('no')\n")
    broken = tmp_path / "broken.hlo"
    broken.write_text("HloModule x\nENTRY main {\n  ROOT a = f32[2] parameter(\n}\n")
    unsupported = tmp_path / "unsupported.hlo"
    unsupported.write_text(textwrap.dedent("""\
        HloModule bad
        ENTRY main {
          x = f32[4,4] parameter(0)
          ROOT y = f32[4,4] cholesky(x)
        }
        """))
    never = tmp_path / "never.sh"
    never.write_text("#!/bin/sh\nexit 1\n")
    never.chmod(0o755)
    cases = [
        (("reduce", tmp_path / "missing.hlo", "--test", script, "--output", out), "U001", "not found"),
        (("reduce", model, "--test", tmp_path / "nope.py", "--output", out), "U001", "test script not found"),
        (("reduce", model, "--test", plain, "--output", out), "U002", "not an executable"),
        (("reduce", model, "--output", out), "U002", "one of the arguments --test --workdir is required"),
        (("reduce", model, "--test", script, "--workdir", tmp_path, "--output", out), "U002", "not allowed"),
        (("reduce", model, "--test", script, "--job", "WalrusDriver", "--output", out), "U002", "--job"),
        (("reduce", model, "--test", script, "-o", tmp_path / "no" / "o.hlo"), "U004", "does not exist"),
        (("reduce", broken, "--test", script, "--output", out), "U018", r"\[E103\]"),
        (("reduce", unsupported, "--test", script, "--output", out), "U018", r"\[E201\]"),
        (("reduce", model, "--test", never, "--output", out), "U017", "never.sh exited 1"),
        (("reduce", model, "--workdir", tmp_path / "nowhere", "--output", out), "U001", "no such work"),
        (("reduce", model, "--workdir", tmp_path, "--output", out), "U014", "neither"),
        (("reduce", model, "--test", script, "--output", out, "--jobs", "0"), "U002", "greater than 0"),
    ]
    for args, code, words in cases:
        result = ncc(*args)
        line = assert_one_line_error(result, code)
        assert re.search(words, line), line
        assert not out.exists() and not (tmp_path / "out.hlo.pb").exists()
    assert_no_scratch(tmp_path)


def test_an_output_that_would_overwrite_what_the_reduction_reads_is_refused(tmp_path: Path) -> None:
    text, proto = tmp_path / "softmax.hlo", tmp_path / "softmax.hlo.pb"
    text.write_bytes(find_model("softmax.hlo").read_bytes())
    proto.write_bytes(find_model("softmax.hlo.pb").read_bytes())
    script = keep_script(tmp_path)
    before = {path: path.read_bytes() for path in (text, proto, script)}
    cases = [
        (text, text, "would overwrite the model"),
        (text, proto, "would overwrite the model"),  # -o X.hlo.pb writes X.hlo too
        (proto, text, "would overwrite the model's twin"),  # the .hlo.pb model's text beside it
        (text, script, "would overwrite the --test script"),
        (text, Path("/dev/null"), "not a regular file"),
        (text, tmp_path, "not a regular file"),
    ]
    for model, output, words in cases:
        result = ncc("reduce", model, "--test", script, "-o", output)
        assert words in assert_one_line_error(result, "U002"), output
    assert {path: path.read_bytes() for path in before} == before
    assert not Path("/dev/null.pb").exists()
    assert_no_scratch(tmp_path)


def test_a_work_dir_without_the_failure_is_u016(tmp_path: Path) -> None:
    """A compile that failed in its first job (an unsupported op): nothing to keep for --job
    WalrusDriver, and a compile that succeeded has no failure at all."""
    bad = tmp_path / "bad.hlo"
    bad.write_text("ENTRY main {\n  x = f32[4,4] parameter(0)\n  ROOT y = f32[4,4] cholesky(x)\n}\n")
    failed = tmp_path / "bad.work"
    compiled = ncc("compile", bad, "--output", tmp_path / "bad.neff", "--workdir", failed)
    assert compiled.returncode == 1, compiled.stderr
    model = find_model("add_mul.hlo")
    out = tmp_path / "out.hlo"
    result = ncc("reduce", model, "--workdir", failed, "--job", "WalrusDriver", "--output", out)
    line = assert_one_line_error(result, "U016")
    assert "job WalrusDriver did not fail" in line and "HLOToTensorizer" in line
    good = tmp_path / "good.work"
    assert ncc("compile", model, "--output", tmp_path / "good.neff", "--workdir", good).returncode == 0
    line = assert_one_line_error(ncc("reduce", model, "--workdir", good, "--output", out), "U016")
    assert "has no failed job" in line
    assert not out.exists()
    assert_no_scratch(tmp_path)
