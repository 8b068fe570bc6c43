"""transpose(dot(a, b)) folded into a dot of transposed operands (tools/hlo2penguin/transpose_folding.py):
where it folds and where it must not, the same values under the golden evaluator, and from the
CLI a grouped-query attention (JAX's LLaMA scores: dot(k, q), then a transpose) that verifies."""

from __future__ import annotations

from pathlib import Path

import numpy as np
from conftest import run_ncc

from ncc.tools.hlo.hlo_text import parse_hlo_text
from ncc.tools.hlo2penguin.lower import lower_module
from ncc.tools.hlo2penguin.transpose_folding import fold_transposes
from ncc.tools.hlo_opt.golden.evaluator import evaluate, make_inputs
from ncc.tools.hlo_opt.optimizer import optimize, pass_list

ADD_MAX = """ADD { a = f32[] parameter(0)  b = f32[] parameter(1)  ROOT s = f32[] add(a, b) }
MAX { a = f32[] parameter(0)  b = f32[] parameter(1)  ROOT m = f32[] maximum(a, b) }
"""


def grouped_scores(queries: int, keys: int, softmax: bool = True) -> str:
    """A grouped-query attention's scores as JAX writes them: k [1, keys, 2 kv heads, 64] and
    q [1, queries, 2, 2 groups, 64]; dot(k, q) is [1, 2, keys, queries, 2], transposed to
    [1, 2, 2, queries, keys] (and its softmax over the keys)."""
    scores = f"f32[1,2,2,{queries},{keys}]"
    head = f"""HloModule grouped_scores
{ADD_MAX}ENTRY main {{
  k = f32[1,{keys},2,64] parameter(0)
  q = f32[1,{queries},2,2,64] parameter(1)
  d = f32[1,2,{keys},{queries},2] dot(k, q), lhs_batch_dims={{0,2}}, lhs_contracting_dims={{3}},
    rhs_batch_dims={{0,2}}, rhs_contracting_dims={{4}}
"""
    if not softmax:
        return head + f"  ROOT t = {scores} transpose(d), dimensions={{0,1,4,3,2}}\n}}\n"
    return head + f"""  t = {scores} transpose(d), dimensions={{0,1,4,3,2}}
  ninf = f32[] constant(-inf)
  mx = f32[1,2,2,{queries}] reduce(t, ninf), dimensions={{4}}, to_apply=MAX
  mxb = {scores} broadcast(mx), dimensions={{0,1,2,3}}
  sub = {scores} subtract(t, mxb)
  e = {scores} exponential(sub)
  zero = f32[] constant(0)
  sum = f32[1,2,2,{queries}] reduce(e, zero), dimensions={{4}}, to_apply=ADD
  sumb = {scores} broadcast(sum), dimensions={{0,1,2,3}}
  ROOT p = {scores} divide(e, sumb)
}}
"""


def _instructions(module) -> dict[str, object]:
    return {i.name: i for c in module.computations for i in c.instructions}


def test_the_transposed_scores_become_one_dot_of_q_by_k_with_the_same_values() -> None:
    module = parse_hlo_text(grouped_scores(128, 128, softmax=False))
    folded = fold_transposes(module)
    by_name = _instructions(folded)
    assert "d" not in by_name and by_name["t"].opcode == "dot"  # the dot took the transpose's place
    dot = by_name["t"]
    numbers = dot.dot_dimension_numbers
    assert list(numbers.lhs_batch_dimensions) == list(numbers.rhs_batch_dimensions) == [0, 1]
    assert list(numbers.lhs_contracting_dimensions) == [4] and list(numbers.rhs_contracting_dimensions) == [3]
    lhs, rhs = (next(i for i in by_name.values() if i.id == o) for o in dot.operand_ids)
    assert list(lhs.shape.dimensions) == [1, 2, 2, 128, 64]  # q: batch, group, query, contracting
    assert list(rhs.shape.dimensions) == [1, 2, 128, 64]  # k: batch, key, contracting
    inputs = make_inputs(module, seed=3)
    (expected,), (got,) = evaluate(module, inputs), evaluate(folded, inputs)
    np.testing.assert_allclose(got, expected, rtol=1e-5, atol=1e-5)


def test_nothing_folds_where_it_must_not() -> None:
    """A dot that something else reads too, a transpose that moves a batch dimension, and a
    decode step's one query against 128 keys (its tiles would hold 2 rows instead of 128): the
    module comes back as it was."""
    read_twice = grouped_scores(128, 128, softmax=False).replace(
        "  ROOT t = ", "  t = ").removesuffix("}\n") + \
        "  ROOT both = (f32[1,2,2,128,128], f32[1,2,128,128,2]) tuple(t, d)\n}\n"
    batch_moved = grouped_scores(128, 128, softmax=False).replace(
        "f32[1,2,2,128,128] transpose(d), dimensions={0,1,4,3,2}",
        "f32[1,128,2,128,2] transpose(d), dimensions={0,3,1,2,4}")
    decode = grouped_scores(1, 128, softmax=False)
    for text in (read_twice, batch_moved, decode):
        module = parse_hlo_text(text)
        assert fold_transposes(module) is module


def test_the_grouped_softmax_joins_the_scores_nest() -> None:
    """Folded, the scores' dot has a group axis of its own (the lowering's row groups), its product
    tiles are rows of one group's queries (512 of them: whole row blocks), and the softmax over the
    keys runs on them in the dot's nest: the scores never go to HBM."""
    program = lower_module(parse_hlo_text(grouped_scores(512, 256)))
    (dot,) = [n for n in program.nests if any(st.op == "matmul" for st in n.statements)]
    assert [a.name for a in dot.axes] == ["b", "g", "i", "j", "k"] and dot.axes[1].extent == 2
    optimize(program, pass_list("", 2))
    (dot,) = [n for n in program.nests if any(st.op == "matmul" for st in n.statements)]
    ops = [(st.op, st.func) for st in dot.statements]
    assert ("tensor_reduce", "maximum") in ops and ("activation", "exp") in ops
    assert len(program.nests) == 1


def _batched_dot(batch: int, rows: int) -> str:
    return f"""HloModule batched
ENTRY main {{
  x = f32[{batch},{rows},256] parameter(0)
  w = f32[256,512] parameter(1)
  ROOT d = f32[{batch},{rows},512] dot(x, w), lhs_contracting_dims={{2}}, rhs_contracting_dims={{0}}
}}
"""


def test_a_batch_of_sequences_is_row_groups_where_row_blocks_divide_them() -> None:
    """Rows [batch, sequence]: one or two row tiles a sequence, or whole blocks of four, are row
    groups (an axis g of the dot's nest); three tiles a sequence would split tile_order's blocks
    across sequences, and stay one run of rows."""
    def axes(batch: int, rows: int) -> list[str]:
        program = lower_module(parse_hlo_text(_batched_dot(batch, rows)))
        (dot,) = [n for n in program.nests if any(st.op == "matmul" for st in n.statements)]
        return [a.name for a in dot.axes]

    for rows in (128, 256, 512, 1024):
        assert axes(4, rows) == ["b", "g", "i", "j", "k"], rows
    for rows in (384, 200):
        assert axes(4, rows) == ["b", "i", "j", "k"], rows


def test_grouped_attention_verifies_from_the_cli(tmp_path: Path) -> None:
    model = tmp_path / "grouped.hlo"
    model.write_text(grouped_scores(256, 256))
    rng = np.random.default_rng(11)
    k = rng.normal(0, 1, (1, 256, 2, 64)).astype(np.float32)
    q = rng.normal(0, 1, (1, 256, 2, 2, 64)).astype(np.float32)
    np.savez(tmp_path / "in.npz", arg0=k, arg1=q)
    neff = tmp_path / "grouped.neff"
    compiled = run_ncc("compile", str(model), "--output", str(neff), "--verify", timeout=300)
    assert compiled.returncode == 0, compiled.stderr
    out = tmp_path / "out.npz"
    ran = run_ncc("run", str(neff), "--inputs", str(tmp_path / "in.npz"), "--output", str(out), timeout=300)
    assert ran.returncode == 0, ran.stderr
    scores = np.einsum("bqkgd,bskd->bkgqs", q, k)  # [1, 2 kv, 2 groups, queries, keys]
    probabilities = np.exp(scores - scores.max(axis=-1, keepdims=True))
    probabilities /= probabilities.sum(axis=-1, keepdims=True)
    np.testing.assert_allclose(np.load(out)["out0"], probabilities, rtol=1e-4, atol=1e-6)
