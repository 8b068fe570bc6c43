"""Fuzz the whole front end with mutated real models: a module or a CompileError, never anything else.

Two levels, both seeded and reproducible:

* in process: thousands of mutants of every bundled model's `.hlo` (text edits that keep most of
  it parseable: numbers, opcodes, types, operands, lines; plus raw character edits) and `.hlo.pb`
  (raw byte edits, and field edits of the decoded proto re-serialized, which reach far deeper)
  go through hlo_reader → hlo_verify → lower → the BIR instruction budget → bir_codegen. Only a
  CompileError may escape, and it must not be an "internal" one; a mutant that runs longer than
  CASE_TIMEOUT_S is a hang. Programs over the budget must be refused with E302 before unrolling
  (proved by memory: the refusal allocates under UNROLL_REFUSAL_MAX_BYTES, not by the clock);
  programs under it but larger than FUZZ_UNROLL_CAP are not unrolled (time).
* CLI: ~20 mutants through a real `ncc compile` (every job, in fresh processes): exit 0, or exit 1
  with exactly one `ncc: error: [E...]` line on stderr; never a traceback, an F-code or a hang.
  Half are mutants the front end accepts, so the backend sees odd shapes; each one that compiles
  is run with `ncc run` and compared with the numpy evaluator (a miscompile is a failure too).

Also here: the instruction budget (bir_codegen.check_budget) on a huge legal program, in process
and through the CLI, and its count against real unrolling on random predicates.
A failing case names its seed and mutation so it can be replayed with `mutant(...)`.
"""

from __future__ import annotations

import math
import random
import re
import signal
import tracemalloc
from collections import Counter
from collections.abc import Callable
from pathlib import Path

import numpy as np
import pytest
from conftest import MODELS_DIR, run_ncc
from google.protobuf.message import DecodeError, EncodeError

from ncc.schemas import common_pb2, hlo_pb2, penguin_pb2
from ncc.tools.common import affine
from ncc.tools.common.errors import CompileError
from ncc.tools.common.penguin_budget import (
    MAX_INSTRUCTIONS,
    backend_instruction_count,
    check_budget,
    instruction_count,
)
from ncc.tools.hlo.hlo_reader import parse_module_proto, parse_module_text
from ncc.tools.hlo.hlo_types import T, dims, element_count, entry_computation, leaf_shapes
from ncc.tools.hlo.hlo_verify import SUPPORTED_OPCODES, verify_module
from ncc.tools.hlo2penguin.lower import lower_module
from ncc.tools.hlo_opt.bir_codegen import lower_to_bir
from ncc.tools.hlo_opt.golden.evaluator import evaluate, make_inputs

MODELS = sorted(path.name[: -len(".hlo.pb")] for path in MODELS_DIR.glob("*.hlo.pb"))
CASES_PER_MODEL = 300  # per model and per format (text, proto): 10 models → 6000 mutants
FUZZ_UNROLL_CAP = 20_000  # unroll only programs up to this many BIR instructions (≈ 0.6 s)
UNROLL_REFUSAL_MAX_BYTES = 64 << 20  # E302 must come before materializing: a refusal allocates little
# One in-process mutant: a hang catcher. Most take well under a second; the slowest (scatter_add text
# #192, a scatter lowered row by row into 12k nests) takes about 18 s with the other core busy, so
# the limit leaves room for a loaded CI machine (it failed once at 30 s with both cores shared).
CASE_TIMEOUT_S = 120

INTERESTING_INTS = [
    0,
    1,
    2,
    3,
    5,
    7,
    64,
    65,
    127,
    128,
    129,
    255,
    256,
    300,
    511,
    512,
    513,
    1000,
    1024,
    1280,
    2047,
    2048,
    2049,
    4096,
    65536,
    1 << 20,
    1 << 24,
    1 << 31,
    (1 << 31) - 1,
    1 << 40,
    -1,
]
TYPES = ["f32", "bf16", "f16", "s32", "u32", "s8", "u8", "s16", "u16", "u64", "pred", "f64", "s64", "token"]
DIRECTIONS = ["EQ", "NE", "LT", "LE", "GT", "GE", "XX"]
OPCODES = sorted(SUPPORTED_OPCODES) + ["abs", "pad", "gather", "while"]
_CHAR_FRAGMENTS = [
    "{",
    "}",
    "(",
    ")",
    "[",
    "]",
    ",",
    "=",
    "%",
    "-",
    "0",
    "9",
    "f32",
    "ROOT ",
    "\n",
    " ",
    "{...}",
    "dimensions={",
    "to_apply=",
    "ä",
    "\x00",
]


# ---- text mutations --------------------------------------------------------------------------------
def _replace_match(text: str, pattern: str, rng: random.Random, make: Callable[[str], str]) -> str:
    matches = list(re.finditer(pattern, text))
    if not matches:
        return text
    m = rng.choice(matches)
    return text[: m.start()] + make(m.group(0)) + text[m.end() :]


def mutate_text(text: str, rng: random.Random) -> str:
    """1–3 edits; most keep the text parseable so the verifier and the lowering see the result."""

    def number(_: str) -> str:
        return str(rng.choice(INTERESTING_INTS))

    def type_name(_: str) -> str:
        return rng.choice(TYPES) + "["

    def opcode(_: str) -> str:
        return rng.choice(OPCODES)

    def direction(_: str) -> str:
        return "direction=" + rng.choice(DIRECTIONS)

    def dim_list(_: str) -> str:
        return "{" + ",".join(str(rng.randrange(4)) for _ in range(rng.randrange(4))) + "}"

    for _ in range(rng.randint(1, 3)):
        choice = rng.random()
        lines = text.split("\n")
        if choice < 0.15:  # every occurrence of one size: the shapes stay consistent, the tiling changes
            sizes = sorted(set(re.findall(r"(?<=[\[,])\d+(?=[\],])", text)))
            if sizes:
                old, new = rng.choice(sizes), str(rng.choice(INTERESTING_INTS))
                text = re.sub(rf"(?<![\w.]){old}(?![\w.])", new, text)
        elif choice < 0.35:  # one number: a dimension, an index, a constant, an attribute
            text = _replace_match(text, r"(?<![\w.])\d+(?![\w.])", rng, number)
        elif choice < 0.43:
            text = _replace_match(text, r"\b(" + "|".join(TYPES) + r")\[", rng, type_name)
        elif choice < 0.52:
            text = _replace_match(text, r"(?<=\] )[a-z][a-z\-]*(?=\()", rng, opcode)
        elif choice < 0.60:
            text = _replace_match(text, r"direction=\w+", rng, direction)
        elif choice < 0.70:  # an operand name replaced by another defined name
            defined = re.findall(r"^\s*(?:ROOT )?%?([\w.\-]+) =", text, re.M)
            if defined:
                text = _replace_match(
                    text,
                    r"(?<=[(,] )%?[\w.\-]+(?=[,)])|(?<=\()%?[\w.\-]+(?=[,)])",
                    rng,
                    lambda _, names=defined: rng.choice(names),
                )
        elif choice < 0.76:
            text = _replace_match(text, r"\{[\d,]*\}", rng, dim_list)
        elif choice < 0.84 and len(lines) > 1:
            i = rng.randrange(len(lines))
            if rng.random() < 0.5:
                del lines[i]
            else:
                lines.insert(rng.randrange(len(lines) + 1), lines[i])
            text = "\n".join(lines)
        elif choice < 0.90 and len(lines) > 2:
            i, j = rng.randrange(len(lines)), rng.randrange(len(lines))
            lines[i], lines[j] = lines[j], lines[i]
            text = "\n".join(lines)
        else:  # raw characters
            pos = rng.randrange(len(text) + 1)
            if rng.random() < 0.5:
                text = text[:pos] + text[pos + rng.randint(1, 8) :]
            else:
                text = text[:pos] + rng.choice(_CHAR_FRAGMENTS) + text[pos:]
    return text


# ---- proto mutations -------------------------------------------------------------------------------
def mutate_bytes(data: bytes, rng: random.Random) -> bytes:
    """Raw edits of serialized bytes: flips, inserts, deletes, truncation, a repeated chunk."""
    buf = bytearray(data)
    for _ in range(rng.randint(1, 4)):
        choice, pos = rng.random(), rng.randrange(len(buf) + 1)
        if choice < 0.4 and buf:
            pos = min(pos, len(buf) - 1)
            buf[pos] = rng.randrange(256) if rng.random() < 0.5 else buf[pos] ^ (1 << rng.randrange(8))
        elif choice < 0.6:
            buf[pos:pos] = bytes(rng.randrange(256) for _ in range(rng.randint(1, 4)))
        elif choice < 0.8:
            del buf[pos : pos + rng.randint(1, 16)]
        elif choice < 0.9:
            del buf[pos:]
        else:
            end = min(len(buf), pos + rng.randint(1, 64))
            buf[pos:pos] = buf[pos:end]
    return bytes(buf)


def _some_dims(rng: random.Random, rank: int) -> list[int]:
    return [rng.randrange(max(1, rank + 1)) for _ in range(rng.randrange(rank + 2))]


def mutate_proto(module: hlo_pb2.HloModuleProto, rng: random.Random) -> None:
    """1–3 field edits of random instructions: shapes, types, opcodes, operands, attributes, roots."""
    instrs = [(comp, instr) for comp in module.computations for instr in comp.instructions]
    ids = [instr.id for _, instr in instrs]
    for _ in range(rng.randint(1, 3)):
        comp, instr = rng.choice(instrs)
        rank = len(instr.shape.dimensions)
        choice = rng.randrange(15)
        if choice >= 13 and rank:  # every occurrence of one size: shapes stay consistent, tiling changes
            old, new = rng.choice(list(instr.shape.dimensions)), rng.choice(INTERESTING_INTS)
            for _, other in instrs:
                for shape in [other.shape, *other.shape.tuple_shapes]:
                    shape.dimensions[:] = [new if d == old else d for d in shape.dimensions]
        elif choice == 0 and rank:
            instr.shape.dimensions[rng.randrange(rank)] = rng.choice(INTERESTING_INTS)
        elif choice == 1:
            if rank and rng.random() < 0.5:
                del instr.shape.dimensions[rng.randrange(rank)]
            else:
                instr.shape.dimensions.insert(rng.randrange(rank + 1), rng.choice(INTERESTING_INTS[:12]))
        elif choice == 2:
            instr.shape.element_type = rng.randrange(0, 25)
        elif choice == 3:
            instr.opcode = rng.choice(OPCODES)
        elif choice == 4 and instr.operand_ids:
            instr.operand_ids[rng.randrange(len(instr.operand_ids))] = rng.choice(ids + [-1, 1 << 40])
        elif choice == 5:
            if instr.operand_ids and rng.random() < 0.5:
                del instr.operand_ids[rng.randrange(len(instr.operand_ids))]
            else:
                instr.operand_ids.append(rng.choice(ids))
        elif choice == 6:
            del instr.dimensions[:]
            instr.dimensions.extend(_some_dims(rng, rank))
        elif choice == 7:
            dn = instr.dot_dimension_numbers
            field = rng.choice(
                [
                    dn.lhs_batch_dimensions,
                    dn.rhs_batch_dimensions,
                    dn.lhs_contracting_dimensions,
                    dn.rhs_contracting_dimensions,
                ]
            )
            del field[:]
            field.extend(_some_dims(rng, 3))
        elif choice == 8:
            if instr.slice_dimensions:
                s = instr.slice_dimensions[rng.randrange(len(instr.slice_dimensions))]
                setattr(s, rng.choice(["start", "limit", "stride"]), rng.choice(INTERESTING_INTS))
            else:
                instr.slice_dimensions.add(start=rng.randrange(3), limit=rng.randrange(5), stride=1)
        elif choice == 9:
            attr = rng.choice(["parameter_number", "tuple_index"])
            setattr(instr, attr, rng.choice(INTERESTING_INTS))
        elif choice == 10:
            instr.comparison_direction = rng.choice(DIRECTIONS)
        elif choice == 11:
            comp.root_id = rng.choice(ids)
        else:
            if instr.literal.f32s:
                position = rng.randrange(len(instr.literal.f32s))
                instr.literal.f32s[position] = rng.choice([0.0, -1e30, float("nan")])
            elif rng.random() < 0.5:
                instr.literal.f32s.append(1.0)
            else:
                del instr.called_computation_ids[:]
                instr.called_computation_ids.append(rng.choice([c.id for c in module.computations]))


def mutant(model: str, fmt: str, seed: int, index: int) -> tuple[bytes, str]:
    """The index-th mutant of a model in format fmt ("text" | "proto") for a seed: (bytes, what was done)."""
    rng = random.Random(f"{seed}:{model}:{fmt}:{index}")
    if fmt == "text":
        return mutate_text((MODELS_DIR / f"{model}.hlo").read_text(), rng).encode(), "text"
    data = (MODELS_DIR / f"{model}.hlo.pb").read_bytes()
    if rng.random() < 0.3:
        return mutate_bytes(data, rng), "bytes"
    module = hlo_pb2.HloModuleProto()
    module.ParseFromString(data)
    mutate_proto(module, rng)
    try:
        return module.SerializeToString(), "fields"
    except (EncodeError, ValueError):  # e.g. an invalid enum the runtime refuses to write: use raw bytes
        return mutate_bytes(data, rng), "bytes"


def front_end(data: bytes, fmt: str, unroll_cap: int = FUZZ_UNROLL_CAP) -> tuple[str, int]:
    """Everything `ncc compile` does before the backend, in process: (outcome, BIR instruction count).

    The outcome is "ok", "large" (within the budget but over `unroll_cap`: not unrolled) or E302;
    any other CompileError propagates.
    """
    module = parse_module_text(data) if fmt == "text" else parse_module_proto(data)
    verify_module(module)
    program = lower_module(module)
    count, points, _, _ = instruction_count(program)
    backend, _, _ = backend_instruction_count(program)
    assert backend >= count
    if backend > MAX_INSTRUCTIONS or points > MAX_INSTRUCTIONS:
        refused, peak = refusal_and_peak_bytes(program)
        assert refused.code == "E302", refused.one_line()
        assert peak < UNROLL_REFUSAL_MAX_BYTES, "the budget must be checked before unrolling"
        return "E302", count
    assert check_budget(program) == count
    if count > unroll_cap:
        return "large", count
    bir = lower_to_bir(program)
    assert len(bir.instructions) <= count
    return "ok", count


def refusal_and_peak_bytes(program: penguin_pb2.Program) -> tuple[CompileError, int]:
    """lower_to_bir's CompileError on `program`, and the most memory Python held meanwhile."""
    tracemalloc.start()
    try:
        with pytest.raises(CompileError) as refused:
            lower_to_bir(program)
        return refused.value, tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()


def _hang(signum: int, frame: object) -> None:
    raise TimeoutError(f"no result within {CASE_TIMEOUT_S} s")


def test_models_are_bundled() -> None:
    assert len(MODELS) >= 10, MODELS


def fuzz_one(model: str, fmt: str, index: int) -> str:
    """mutant(model, fmt, 0, index) through the front end: its outcome; anything but a CompileError fails."""
    data, how = mutant(model, fmt, 0, index)
    replay = f"mutant({model!r}, {fmt!r}, 0, {index}) [{how}]"
    try:
        return front_end(data, fmt)[0]
    except CompileError as err:
        assert "internal" not in err.message.lower(), f"{replay}: {err.one_line()}"
        return err.code
    except (DecodeError, TimeoutError) as err:  # never: the reader turns DecodeError into E102
        raise AssertionError(f"{replay}: {err!r}") from err
    except Exception as err:
        raise AssertionError(f"{replay} crashed the front end: {type(err).__name__}: {err}") from err


@pytest.mark.sweep
@pytest.mark.parametrize("shard", [0, 1])
@pytest.mark.parametrize("fmt", ["text", "proto"])
def test_front_end_fuzz_never_crashes(fmt: str, shard: int) -> None:
    """Thousands of seeded mutants of every model: the front end ends in a program or a CompileError.
    Two shards (even and odd mutant numbers) per format, so that the sweep spreads over the cores."""
    outcomes: Counter[str] = Counter()
    previous = signal.signal(signal.SIGALRM, _hang)
    try:
        for model in MODELS:
            for index in range(shard, CASES_PER_MODEL, 2):
                signal.setitimer(signal.ITIMER_REAL, CASE_TIMEOUT_S)
                outcomes[fuzz_one(model, fmt, index)] += 1
                signal.setitimer(signal.ITIMER_REAL, 0)
    finally:
        signal.setitimer(signal.ITIMER_REAL, 0)
        signal.signal(signal.SIGALRM, previous)
    # the mutants must exercise every stage: some compile, some are refused by the verifier
    assert outcomes["ok"] >= 0.05 * sum(outcomes.values()), outcomes
    assert outcomes["E302"] + outcomes["large"] > 0, outcomes  # rescaled shapes reach the budget
    assert any(code.startswith("E2") for code in outcomes), outcomes
    assert any(code.startswith("E1") for code in outcomes), outcomes


def test_budget_refuses_a_program_that_would_unroll_to_millions_of_instructions() -> None:
    """A legal 100M×8 array (3.2 GB) is 781,250 tiles of 128×8 per op: refused before unrolling.
    (A 100M×1 one is planned as 382 tiles of 128×2048 since tile plans take many slivers.)"""
    module = parse_module_text(b"""HloModule huge
ENTRY main {
  x = f32[100000000,8] parameter(0)
  e = f32[100000000,8] exponential(x)
  ROOT t = f32[100000000,8] tanh(e)
}""")
    verify_module(module)
    program = lower_module(module)
    refused, peak = refusal_and_peak_bytes(program)
    assert peak < UNROLL_REFUSAL_MAX_BYTES  # 4.7M instructions would take gigabytes
    assert refused.code == "E302"
    expected = f"program too large: 4,687,500 backend instructions (limit {MAX_INSTRUCTIONS:,})"
    assert expected in refused.message
    assert refused.location in ("e", "t")


def test_budget_count_matches_unrolling_for_any_predicates() -> None:
    """Seeded random nests and predicates (coefficients, constants, coupled axes): count == unrolled."""
    rng = random.Random("budget-count")
    for _ in range(300):
        program = penguin_pb2.Program(name="p")
        for n in range(rng.randint(1, 3)):
            nest = program.nests.add(name=f"n{n}", source=f"n{n}")
            names = [f"a{k}" for k in range(rng.randint(0, 3))]
            nest.axes.extend(penguin_pb2.Axis(name=name, extent=rng.randint(0, 5)) for name in names)
            for k in range(rng.randint(0, 3)):
                statement = nest.statements.add(name=f"s{k}", op="nop", engine=common_pb2.POOL)
                for _ in range(rng.randint(0, 2) if names else 0):
                    terms = {var: rng.randint(-3, 3) for var in rng.sample(names, rng.randint(1, len(names)))}
                    statement.predicates.add(
                        expr=affine.expr(terms, rng.randint(-5, 5)),
                        relation=rng.choice([penguin_pb2.EQ, penguin_pb2.GE]),
                    )
        count, points, _, _ = instruction_count(program)
        assert count == len(lower_to_bir(program).instructions), program
        assert points == sum(math.prod(a.extent for a in nest.axes) for nest in program.nests)


def test_malformed_predicates_are_compile_errors() -> None:
    program = penguin_pb2.Program(name="p")
    nest = program.nests.add(name="n", axes=[penguin_pb2.Axis(name="i", extent=2)])
    statement = nest.statements.add(name="s", op="nop", engine=common_pb2.POOL)
    statement.predicates.add(expr=affine.expr({"nowhere": 1}), relation=penguin_pb2.EQ)
    with pytest.raises(CompileError, match="not an axis of nest 'n'") as info:
        lower_to_bir(program)
    assert info.value.code == "E301"
    statement.predicates[0].CopyFrom(penguin_pb2.Predicate(expr=affine.expr({"i": 1})))
    with pytest.raises(CompileError, match="unknown relation") as info:
        lower_to_bir(program)
    assert info.value.code == "E301"


def test_cli_refuses_a_program_over_the_budget(tmp_path: Path) -> None:
    """Through `ncc compile --loops unrolled --verify`: exit 1, one line naming E302, the first job
    and the HLO instruction. The first job refuses it, so the golden evaluator never tries to
    evaluate 800M elements. (Its loops kept rolled, the same module is 44 NEFF instructions:
    tests/test_rolled_loops.py.)"""
    model = tmp_path / "huge.hlo"
    model.write_text(
        "HloModule huge\nENTRY main {\n  x = f32[100000000,8] parameter(0)\n"
        "  ROOT e = f32[100000000,8] exponential(x)\n}\n"
    )
    proc = run_ncc("compile", str(model), "--loops", "unrolled", "--output", str(tmp_path / "huge.neff"),
                   "--verify", timeout=60)
    assert proc.returncode == 1, proc.stderr
    (line,) = proc.stderr.strip().splitlines()
    expected = "ncc: error: [E302] job HLOToTensorizer: program too large: 2,343,750 backend instructions"
    assert line.startswith(expected), line
    assert "(at e)" in line


CLI_MUTANTS = 20
CLI_UNROLL_CAP = 3_000  # the backend takes ~1 ms per instruction: keep each CLI compile to seconds


def cli_mutants(count: int) -> list[tuple[str, str, int, bytes, str]]:
    """`count` seeded (model, fmt, index, bytes, how): every other one a mutant the front end accepts.

    Accepted mutants (odd shapes, other opcodes) are what reaches the backend, the packager and, with
    --verify, the golden evaluator and the simulator. Mutants the in-process front end finds "large"
    (within the budget but minutes of backend time) are skipped: the in-process fuzz covers them.
    """
    rng, chosen, index = random.Random("cli-fuzz"), [], 0
    while len(chosen) < count:
        model, fmt = rng.choice(MODELS), rng.choice(["text", "proto"])
        data, how = mutant(model, fmt, 1, index)
        index += 1
        try:
            outcome = front_end(data, fmt, CLI_UNROLL_CAP)[0]
        except CompileError:
            outcome = "refused"
        if outcome == "ok" or (outcome != "large" and len(chosen) % 2):
            chosen.append((model, fmt, index - 1, data, how))
    return chosen


DIFFERENTIAL_MAX_ELEMENTS = 1 << 22  # evaluate a compiled mutant in numpy only when it is this small


def differential_check(data: bytes, fmt: str, neff: Path, tmp_path: Path) -> str:
    """Run a compiled mutant with `ncc run` on seeded inputs and compare with the numpy evaluator.

    Returns "" when they agree (or the mutant is too big to evaluate), else what differs. Tolerance:
    max |error| <= tol * max(1, max |expected|), tol 2e-2 if the module has any bf16/f16 value, else
    1e-4 (fp32 sums in another order); infinities and NaNs must sit at the same places.
    """
    module = parse_module_text(data) if fmt == "text" else parse_module_proto(data)
    shapes = [i.shape for c in module.computations for i in c.instructions]
    if sum(element_count(shape) for shape in shapes) > DIFFERENTIAL_MAX_ELEMENTS:
        return ""
    tol = 2e-2 if any(shape.element_type in (T.BF16, T.F16) for shape in shapes) else 1e-4
    inputs = make_inputs(module, 0)
    entry = entry_computation(module)
    root = next(instr for instr in entry.instructions if instr.id == entry.root_id)
    expected = evaluate(module, inputs, verify=False)
    assert [e.shape for e in expected] == [dims(shape) for shape in leaf_shapes(root.shape)]
    inputs_path, out_path = tmp_path / "diff_in.npz", tmp_path / "diff_out.npz"
    np.savez(inputs_path, **{f"arg{k}": np.asarray(a) for k, a in enumerate(inputs)})
    ran = run_ncc("run", str(neff), "--inputs", str(inputs_path), "--output", str(out_path), timeout=120)
    if ran.returncode != 0:
        return f"ncc run exit {ran.returncode}: {ran.stderr.strip()}"
    with np.load(out_path) as outputs:
        for k, want in enumerate(expected):
            got = outputs[f"out{k}"].astype(np.float64)
            want = np.asarray(want, dtype=np.float64)
            if got.shape != want.shape:
                return f"out{k}: shape {got.shape}, HLO result {want.shape}"
            finite = np.isfinite(want)
            if not np.array_equal(finite, np.isfinite(got)) or not np.array_equal(
                got[~finite], want[~finite], equal_nan=True
            ):
                return f"out{k}: infinities or NaNs differ"
            scale = max(1.0, float(np.max(np.abs(want[finite]), initial=0.0)))
            error = float(np.max(np.abs(got[finite] - want[finite]), initial=0.0))
            if error > tol * scale:
                return f"out{k}: max |error| {error:.3g} > {tol:g} * {scale:.3g}"
    return ""


@pytest.mark.slow
@pytest.mark.sweep
def test_cli_fuzz_exit_codes_and_one_line_errors(tmp_path: Path) -> None:
    """~20 seeded mutants through a real `ncc compile`: exit 0, or 1 with one `ncc: error: [E...]` line."""
    codes: Counter[str] = Counter()
    for model, fmt, index, data, how in cli_mutants(CLI_MUTANTS):
        path = tmp_path / f"m{index}{'.hlo' if fmt == 'text' else '.hlo.pb'}"
        path.write_bytes(data)
        replay = f"mutant({model!r}, {fmt!r}, 1, {index}) [{how}]"
        proc = run_ncc(
            "compile", str(path), "--output", str(tmp_path / f"m{index}.neff"), "--timeout", "60", timeout=120
        )
        assert "Traceback" not in proc.stderr + proc.stdout, f"{replay}: {proc.stderr}"
        assert proc.returncode in (0, 1), f"{replay}: exit {proc.returncode}: {proc.stderr}"
        if proc.returncode == 0:
            codes["ok"] += 1
            mismatch = differential_check(data, fmt, tmp_path / f"m{index}.neff", tmp_path)
            assert not mismatch, f"{replay}: compiled, but the NEFF disagrees with the evaluator: {mismatch}"
            continue
        lines = proc.stderr.strip().splitlines()
        assert len(lines) == 1, f"{replay}: {proc.stderr}"
        match = re.match(r"ncc: error: \[(E\d{3})\] ", lines[0])
        assert match, f"{replay}: {lines[0]}"
        codes[match.group(1)] += 1
    assert codes["ok"] and len(codes) > 2, codes
