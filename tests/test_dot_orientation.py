"""A dot whose lhs rows end in a part tile, computed with its operands swapped (lower.py
`_swapped_dot`, docs/architecture.md): which dots swap; that the elementwise ops after one follow
its stored layout and join its nest; that on-chip forwarding serves the swapped dot's moving
operand and its product's row-major reader through PE transposes, so nothing but the output goes
to HBM; and from the CLI a ViT-shaped MLP over 197 tokens that verifies, matches numpy, and runs
in well under the time of the same MLP over 256 tokens (with the tokens as row tiles of 128 and
69, the two took the same PE time)."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
from orchestrator_support import compile_and_run

from ncc.schemas import common_pb2
from ncc.tools.hlo.hlo_text import parse_hlo_text
from ncc.tools.hlo2penguin.lower import lower_module
from ncc.tools.hlo_opt.optimizer import optimize, pass_list

D, FFN = 768, 1024


def mlp(tokens: int) -> str:
    """tanh(tanh(tanh(x) @ w1 + b1) @ w2 + x) over `tokens` rows: two dots whose lhs rows are the
    tokens, the second's product read by a residual add (then a tanh, as a block's next norm would)."""
    return f"""HloModule mlp_{tokens}
ENTRY main {{
  x = f32[{tokens},{D}] parameter(0)
  w1 = f32[{D},{FFN}] parameter(1)
  b1 = f32[{FFN}] parameter(2)
  w2 = f32[{FFN},{D}] parameter(3)
  t = f32[{tokens},{D}] tanh(x)
  h = f32[{tokens},{FFN}] dot(t, w1), lhs_contracting_dims={{1}}, rhs_contracting_dims={{0}}
  hb = f32[{tokens},{FFN}] add(h, f32[{tokens},{FFN}] broadcast(b1), dimensions={{1}})
  g = f32[{tokens},{FFN}] tanh(hb)
  y = f32[{tokens},{D}] dot(g, w2), lhs_contracting_dims={{1}}, rhs_contracting_dims={{0}}
  r = f32[{tokens},{D}] add(y, x)
  ROOT o = f32[{tokens},{D}] tanh(r)
}}
"""


def _optimized(tokens: int):
    program = lower_module(parse_hlo_text(mlp(tokens)))
    optimize(program, pass_list("", 2))
    return program


@pytest.mark.parametrize(("tokens", "swapped"), [(197, True), (256, False), (100, False), (600, False)])
def test_only_dots_whose_rows_end_in_a_part_tile_and_fit_one_moving_tile_swap(tokens: int, swapped: bool):
    """197 rows are tiles of 128 and 69 (both dots swap: the first feeds the second, the second's
    product, read back row-major by the residual add, still takes 0.93 of the written form's PE
    cycles with the transposes back); 256 rows fill two tiles, 100 fit one, and 600 would not
    fit a moving tile of 512 columns (no swap)."""
    program = lower_module(parse_hlo_text(mlp(tokens)))
    dots = [n.name for n in program.nests if any(st.op == "matmul" for st in n.statements)]
    assert len(dots) == 2 and all(name.split("_")[0].endswith(".t") == swapped for name in dots), dots


def lone_dot(rows: int, k: int, n: int, then_dot: bool) -> str:
    """x @ w as the module's result, or (then_dot) tanh of it read by a second dot."""
    dims = "lhs_contracting_dims={1}, rhs_contracting_dims={0}"
    tail = (f"  t = f32[{rows},{n}] tanh(d)\n  v = f32[{n},128] parameter(2)\n"
            f"  ROOT e = f32[{rows},128] dot(t, v), {dims}\n" if then_dot else "")
    root = "" if then_dot else "ROOT "
    return (f"HloModule lone\nENTRY main {{\n  x = f32[{rows},{k}] parameter(0)\n"
            f"  w = f32[{k},{n}] parameter(1)\n  {root}d = f32[{rows},{n}] dot(x, w), {dims}\n{tail}}}\n")


@pytest.mark.parametrize(("k", "then_dot", "swapped"), [(768, False, False), (768, True, True),
                                                         (64, False, False), (64, True, True)])
def test_a_product_read_back_row_major_swaps_only_where_the_transposes_back_pay(k: int, then_dot: bool,
                                                                               swapped: bool):
    """197 × k × 768: read by another dot as it is stored, the swap saves 0.77 of the columns; as
    the module's result the PE transposes it back (12 of them), which takes more than the swap
    saves at k = 64 and leaves too little of the saving at k = 768 (0.98 of the written form)."""
    program = lower_module(parse_hlo_text(lone_dot(197, k, 768, then_dot)))
    first = next(n.name for n in program.nests if any(st.op == "matmul" for st in n.statements))
    assert first.split("_")[0].endswith(".t") == swapped, first


def test_an_integer_dot_off_the_pe_keeps_its_form():
    """An s32 dot is computed exactly off the PE (lower.py `_integer_dot`), where the rule's PE
    columns mean nothing: it keeps its operands as written whatever its rows."""
    dims = "lhs_contracting_dims={1}, rhs_contracting_dims={0}"
    text = (f"HloModule ints\nENTRY main {{\n  x = s32[197,256] parameter(0)\n"
            f"  w = s32[256,256] parameter(1)\n  v = s32[256,128] parameter(2)\n"
            f"  d = s32[197,256] dot(x, w), {dims}\n"
            f"  ROOT e = s32[197,128] dot(d, v), {dims}\n}}\n")
    program = lower_module(parse_hlo_text(text))
    assert not any(n.name.split("_")[0].endswith(".t") for n in program.nests)


def test_the_epilogue_follows_the_stored_layout_and_nothing_but_the_output_reaches_hbm():
    program = _optimized(197)
    tensors = {t.name: t for t in program.tensors}
    first = next(n for n in program.nests if n.name.startswith("h.t"))
    # the bias add and tanh read the product feature by feature, the bias one column a partition
    assert any(st.op == "activation" and st.func == "tanh" for st in first.statements)
    written = {tensors[a.tensor].view_of or a.tensor for n in program.nests for st in n.statements
               for a in st.outputs if tensors[a.tensor].memory == common_pb2.HBM}
    assert written == {"o"}
    ops = [st.op for n in program.nests for st in n.statements]
    # tanh(x) reaches the first dot's 197 moving columns as two transposed pieces (128 + 69) per
    # contraction tile, and the second dot's [768, 197] product reaches the residual add row-major
    assert ops.count("transpose") >= 4


def test_a_ragged_mlp_verifies_matches_numpy_and_beats_its_256_token_twin(tmp_path: Path):
    times = {}
    for tokens in (197, 256):
        rng = np.random.default_rng(tokens)
        x = rng.normal(size=(tokens, D)).astype(np.float32)
        w1 = (rng.normal(size=(D, FFN)) / np.sqrt(D)).astype(np.float32)
        b1 = (rng.normal(size=FFN) * 0.1).astype(np.float32)
        w2 = (rng.normal(size=(FFN, D)) / np.sqrt(FFN)).astype(np.float32)
        model, inputs = tmp_path / f"mlp{tokens}.hlo", tmp_path / f"mlp{tokens}.npz"
        model.write_text(mlp(tokens))
        np.savez(inputs, arg0=x, arg1=w1, arg2=b1, arg3=w2)
        report = compile_and_run(model, inputs, f"mlp{tokens}")
        expected = np.tanh(np.tanh(np.tanh(x) @ w1 + b1) @ w2 + x)
        np.testing.assert_allclose(report["out0"], expected, rtol=1e-4, atol=1e-4)
        times[tokens] = report["simulated_ns"]
    # 77 % of the tokens: 0.97 of the time as row tiles (PE streams 256 rows' columns either
    # way), 0.84 as moving columns
    assert times[197] < 0.9 * times[256], times
