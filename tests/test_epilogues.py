"""Epilogue fusion (tools/hlo_opt/passes/epilogues.py): the nest after a matmul nest runs inside it
on the evacuated product tile, where that is safe; from the CLI the result still matches."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
from conftest import run_ncc
from orchestrator_support import compile_and_run
from test_penguin_opt import lowered, softmax_of_masked

from ncc.schemas import common_pb2, penguin_pb2
from ncc.tools.hlo_opt.optimizer import optimize, pass_list
from ncc.tools.hlo_opt.passes.epilogues import fuse_epilogues


def dense_tanh(rows: int, k: int, n: int) -> str:
    """A projection of f32[rows, k] by f32[k, n], its bias and a tanh."""
    return f"""HloModule dense_tanh
ENTRY main {{
  x = f32[{rows},{k}] parameter(0)
  w = f32[{k},{n}] parameter(1)
  b = f32[{n}] parameter(2)
  d = f32[{rows},{n}] dot(x, w), lhs_contracting_dims={{1}}, rhs_contracting_dims={{0}}
  bb = f32[{rows},{n}] broadcast(b), dimensions={{1}}
  s = f32[{rows},{n}] add(d, bb)
  ROOT t = f32[{rows},{n}] tanh(s)
}}
"""


# rows of 1,024: the consumer's row tiles are wider than the matmul's 512-column output tiles,
# so it is tiled anew
DENSE_TANH = dense_tanh(256, 384, 1024)

MAX_ADD = """ADD { a = f32[] parameter(0)  b = f32[] parameter(1)  ROOT s = f32[] add(a, b) }
MAX { a = f32[] parameter(0)  b = f32[] parameter(1)  ROOT m = f32[] maximum(a, b) }
"""


def scores_softmax(heads: int, rows: int) -> str:
    """Attention scores q·kᵀ of `heads` heads, scaled, and their softmax over rows of `rows`."""
    scores = f"f32[{heads},{rows},{rows}]"
    return f"""HloModule scores_softmax
{MAX_ADD}ENTRY main {{
  q = f32[{heads},{rows},64] parameter(0)
  k = f32[{heads},{rows},64] parameter(1)
  s = {scores} dot(q, k), lhs_batch_dims={{0}}, rhs_batch_dims={{0}},
    lhs_contracting_dims={{2}}, rhs_contracting_dims={{2}}
  c = f32[] constant(0.125)
  cb = {scores} broadcast(c), dimensions={{}}
  masked = {scores} multiply(s, cb)
""" + softmax_of_masked(heads, rows, rows)


def _optimized(text: str, passes: list[str] | None = None) -> tuple[penguin_pb2.Program, list[str]]:
    program = lowered(text)
    names = passes if passes is not None else pass_list("", 2)
    optimize(program, names)
    return program, [nest.name for nest in program.nests]


def _without_epilogues() -> list[str]:
    return [p for p in pass_list("", 2) if p != "epilogues"]


def test_an_elementwise_consumer_of_a_projection_runs_on_the_matmul_tiles() -> None:
    program, names = _optimized(DENSE_TANH)
    _, apart = _optimized(DENSE_TANH, _without_epilogues())
    assert len(names) == len(apart) - 1
    tensors = {t.name: t for t in program.tensors}
    (dot,) = [n for n in program.nests if any(st.op == "matmul" for st in n.statements)]
    store = next(st for st in dot.statements if st.op == "dma"
                 and tensors[st.outputs[0].tensor].memory == common_pb2.HBM and st.predicates)
    tanh = next(st for st in dot.statements if st.op == "activation" and st.func == "tanh")
    assert list(tanh.predicates) == list(store.predicates)  # at the contraction's last step
    assert list(tanh.outputs[0].extents)[-1] == 512  # tiled as the product, not as whole rows
    # the product no longer goes to HBM: nothing stores `d` any more
    assert not any(tensors[a.tensor].view_of == "d" or a.tensor == "d"
                   for n in program.nests for st in n.statements for a in st.outputs)


def _row_wise(on: bool = True) -> list[str]:
    return [p if p != "epilogues" else f"epilogues{{row_wise={int(on)}}}" for p in pass_list("", 2)]


def _psum_readers(nest: penguin_pb2.LoopNest, tensors: dict[str, penguin_pb2.TensorDecl]) -> list[str]:
    return [st.op for st in nest.statements if st.op != "matmul"
            and any(tensors[a.tensor].memory == common_pb2.PSUM for a in st.inputs)]


def test_the_epilogue_reads_psum_when_nothing_else_reads_the_product() -> None:
    program, _ = _optimized(DENSE_TANH)
    tensors = {t.name: t for t in program.tensors}
    dot = next(n for n in program.nests if any(st.op == "matmul" for st in n.statements))
    assert _psum_readers(dot, tensors) == ["tensor_tensor"]  # the bias add; no evacuating copy


def test_a_product_that_is_also_a_result_keeps_its_store_and_evacuation() -> None:
    both = "t = f32[256,1024] tanh(s)\n  ROOT r = (f32[256,1024], f32[256,1024]) tuple(d, t)"
    text = DENSE_TANH.replace("ROOT t = f32[256,1024] tanh(s)", both)
    program, _ = _optimized(text)
    tensors = {t.name: t for t in program.tensors}
    dot = next(n for n in program.nests if any(st.op == "matmul" for st in n.statements))
    assert len([st for st in dot.statements if st.op == "tanh" or st.func == "tanh"]) == 1  # fused
    assert _psum_readers(dot, tensors) == ["tensor_copy"]  # the evacuation the store needs


def test_a_fused_dot_nest_keeps_the_loops_it_had() -> None:
    """Every access of the product tile names one box (the epilogue reads it as the evacuation
    writes it), so rolling keeps the tile private to an iteration and the nest's loops stay loops
    (GPT-2's FFN nest unrolled whole when it did not: 72 static instructions became 696)."""
    from ncc.tools.hlo_opt import rolling

    text = dense_tanh(1024, 768, 3072)  # GPT-2's FFN: its row-block, column and contraction loops roll
    plans = {}
    for name, passes in {"fused": pass_list("", 2), "apart": _without_epilogues()}.items():
        program, _ = _optimized(text, passes)
        tensors = {t.name: t for t in program.tensors}
        users = rolling.onchip_users(program)
        dot = next(n for n in program.nests if any(st.op == "matmul" for st in n.statements))
        plan = rolling.plan_rolling(dot, tensors, rolling.TouchedElsewhere(users, dot.name), min_trip=2)
        plans[name] = [axis.name for axis in plan.axes] if plan else []
    assert plans["fused"] and plans["fused"] == plans["apart"]


def test_a_softmax_over_one_tile_wide_rows_joins_the_scores_nest_unless_told_not_to() -> None:
    program, names = _optimized(scores_softmax(4, 256))
    _, off = _optimized(scores_softmax(4, 256), _row_wise(False))
    _, apart = _optimized(scores_softmax(4, 256), _without_epilogues())
    assert len(names) == len(apart) - 1 and len(off) == len(apart)
    dot = next(n for n in program.nests if any(st.op == "matmul" for st in n.statements))
    # the max and the sum (the sum as the exp's second output: act_operands) run on its tiles
    assert [st.op for st in dot.statements].count("tensor_reduce") == 1
    assert [len(st.outputs) for st in dot.statements if st.op == "activation"] == [2]


def test_a_softmax_whose_rows_span_several_tiles_joins_at_the_row_s_last_tile() -> None:
    """A row of 1,024 scores is two 512-column matmul tiles (GPT-2's attention): the softmax runs
    where the row's second tile is evacuated, on the row tile both were evacuated into, and the
    scores never go to HBM."""
    program, names = _optimized(scores_softmax(2, 1024))
    _, apart = _optimized(scores_softmax(2, 1024), _without_epilogues())
    assert len(names) == len(apart) - 1
    dot = next(n for n in program.nests if any(st.op == "matmul" for st in n.statements))
    tensors = {t.name: t for t in program.tensors}
    (evacuate,) = [st for st in dot.statements if st.op == "tensor_copy"]
    row = tensors[evacuate.outputs[0].tensor]
    assert row.memory == common_pb2.SBUF and row.block_shape[-1] == 1024
    assert evacuate.outputs[0].extents[-1] == 512  # each tile is one half of the row
    (reduce,) = [st for st in dot.statements if st.op == "tensor_reduce"]
    last_column = [p for p in reduce.predicates if p.relation == penguin_pb2.EQ
                   and [(t.var, t.coeff) for t in p.expr.terms] == [("j", 1)] and p.expr.constant == -1]
    assert last_column and reduce.inputs[0].extents[-1] == 1024
    assert not any(st.op == "dma" and tensors[st.outputs[0].tensor].memory == common_pb2.HBM
                   and st.inputs[0].tensor == evacuate.outputs[0].tensor for st in dot.statements)


def test_wide_rows_need_the_row_to_be_whole_tiles_of_one_axis() -> None:
    """Rows of 768 (a 512-column tile and a 256-column one, as after a d = 768 projection) are not
    one axis's equal tiles: the consumer stays apart."""
    program = lowered(scores_softmax(2, 768))
    optimize(program, [p for p in _without_epilogues() if p in ("fusion", "cse", "dce", "tile_order")])
    before = len(program.nests)
    stats = fuse_epilogues(program, row_wise=True)
    assert stats.epilogues == 0 and len(program.nests) == before
    assert stats.refused["tiles differ and the consumer is not elementwise"] == 1


@pytest.mark.slow
def test_a_wide_row_softmax_verifies_and_gives_the_same_bits_rolled_or_not(tmp_path: Path) -> None:
    rng = np.random.default_rng(3)
    inputs = {"arg0": rng.normal(0, 1, (2, 1024, 64)).astype(np.float32),
              "arg1": rng.normal(0, 1, (2, 1024, 64)).astype(np.float32)}
    for mode in ("unrolled", "rolled"):
        result = _compile_and_run(tmp_path / mode, scores_softmax(2, 1024), inputs, ["--loops", mode])
        assert np.array_equal(result["fused"][1], result["apart"][1])


def test_a_consumer_that_reads_the_product_transposed_stays_apart() -> None:
    text = """HloModule transposed
ENTRY main {
  x = f32[256,256] parameter(0)
  w = f32[256,256] parameter(1)
  d = f32[256,256] dot(x, w), lhs_contracting_dims={1}, rhs_contracting_dims={0}
  t = f32[256,256] transpose(d), dimensions={1,0}
  ROOT e = f32[256,256] exponential(t)
}
"""
    program = lowered(text)
    optimize(program, [p for p in _without_epilogues() if p in ("fusion", "cse", "dce", "tile_order")])
    before = len(program.nests)
    stats = fuse_epilogues(program, row_wise=True)
    assert stats.epilogues == 0 and len(program.nests) == before


def _compile_and_run(tmp_path: Path, text: str, inputs: dict[str, np.ndarray],
                     fused: list[str]) -> dict[str, tuple[float, np.ndarray]]:
    tmp_path.mkdir()
    model = tmp_path / "model.hlo"
    model.write_text(text)
    npz = tmp_path / "in.npz"
    np.savez(npz, **inputs)
    result = {}
    variants = {"fused": fused, "apart": [f"--penguin-passes={','.join(_without_epilogues())}"]}
    for name, flags in variants.items():
        data = compile_and_run(model, npz, name, *flags)
        result[name] = (data["simulated_ns"], data["out0"])
    return result


@pytest.mark.slow
def test_fused_epilogues_verify_from_the_cli_and_the_elementwise_one_takes_less_time(tmp_path: Path) -> None:
    rng = np.random.default_rng(5)
    dense = _compile_and_run(tmp_path / "dense", DENSE_TANH, {
        "arg0": rng.normal(0, 1, (256, 384)).astype(np.float32),
        "arg1": rng.normal(0, 0.05, (384, 1024)).astype(np.float32),
        "arg2": rng.normal(0, 1, 1024).astype(np.float32)}, [])
    assert np.array_equal(dense["fused"][1], dense["apart"][1])  # the same operations on the same values
    assert dense["fused"][0] < dense["apart"][0]
    softmax = _compile_and_run(tmp_path / "softmax", scores_softmax(4, 256), {
        "arg0": rng.normal(0, 1, (4, 256, 64)).astype(np.float32),
        "arg1": rng.normal(0, 1, (4, 256, 64)).astype(np.float32)},
        [])  # row-wise consumers join by default
    assert np.array_equal(softmax["fused"][1], softmax["apart"][1])


BITS_OF_PRODUCT = """HloModule bits
ENTRY main {
  x = f32[128,256] parameter(0)
  w = f32[256,8] parameter(1)
  d = f32[128,8] dot(x, w), lhs_contracting_dims={1}, rhs_contracting_dims={0}
  b = s32[128,8] bitcast-convert(d)
  shift = s32[] constant(31)
  shifts = s32[128,8] broadcast(shift), dimensions={}
  ROOT sign = s32[128,8] shift-right-logical(b, shifts)
}
"""


def test_a_consumer_that_reads_the_product_s_bits_stays_apart(tmp_path: Path) -> None:
    """A load that reinterprets the product's bits (bitcast-convert: MoE's top-k reads the router's
    probabilities as integers) is no tile load to fold: joined, the consumer read the float tile
    as it is, and 26 of 1,024 signs came out wrong."""
    program = lowered(BITS_OF_PRODUCT)
    optimize(program, pass_list("", 2)[: pass_list("", 2).index("epilogues")])
    stats = fuse_epilogues(program)
    assert stats.epilogues == 0 and stats.refused["product read other than by a tile load"] == 1
    model = tmp_path / "bits.hlo"
    model.write_text(BITS_OF_PRODUCT)
    neff = tmp_path / "bits.neff"
    compiled = run_ncc("compile", str(model), "--output", str(neff), "--verify", timeout=300)
    assert compiled.returncode == 0, compiled.stderr


def test_a_vector_matrix_product_s_consumer_stays_apart_and_verifies(tmp_path: Path) -> None:
    """h[16] @ w: the dot's tile holds the product as one [1, 16] row, its consumer's as a
    [16, 1] column (one element a partition); joined, the multiply read the row as the column
    (E410 in birverifier, found by compiling unseen JAX: an RNN over a 1-D state)."""
    text = """HloModule vecmat
ENTRY main {
  h = f32[16] parameter(0)
  w = f32[16,16] parameter(1)
  d = f32[16] dot(h, w), lhs_contracting_dims={0}, rhs_contracting_dims={0}
  c = f32[] constant(0.1)
  cs = f32[16] broadcast(c), dimensions={}
  ROOT m = f32[16] multiply(d, cs)
}
"""
    program = lowered(text)
    optimize(program, [p for p in _without_epilogues() if p in ("fusion", "cse", "dce", "tile_order")])
    assert fuse_epilogues(program).refused["tiles lay the product out otherwise"] == 1
    model = tmp_path / "vecmat.hlo"
    model.write_text(text)
    compiled = run_ncc("compile", str(model), "--output", str(tmp_path / "v.neff"), "--verify", timeout=120)
    assert compiled.returncode == 0, compiled.stderr
