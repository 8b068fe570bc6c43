"""Common subexpressions of the HLO merged before lowering (tools/hlo2penguin/hlo_cse.py): which
instructions merge and which keep their identity, the same values under the golden evaluator, and
from the CLI a layer norm whose `x - mean`, written twice as JAX writes it, is computed once."""

from __future__ import annotations

from pathlib import Path

import numpy as np
from conftest import run_ncc

from ncc.tools.hlo.hlo_text import parse_hlo_text
from ncc.tools.hlo2penguin.hlo_cse import eliminate_common_subexpressions
from ncc.tools.hlo2penguin.lower import lower_module
from ncc.tools.hlo_opt.golden.evaluator import evaluate, make_inputs
from ncc.tools.hlo_opt.optimizer import optimize, pass_list

# A layer norm over rows of 512 as JAX writes it: the mean broadcast twice, x - mean twice.
LAYER_NORM = """HloModule layer_norm
ADD { a = f32[] parameter(0)  b = f32[] parameter(1)  ROOT s = f32[] add(a, b) }
ENTRY main {
  x = f32[256,512] parameter(0)
  zero = f32[] constant(0)
  sum = f32[256] reduce(x, zero), dimensions={1}, to_apply=ADD
  n = f32[] constant(512)
  nb = f32[256] broadcast(n), dimensions={}
  mean = f32[256] divide(sum, nb)
  mb1 = f32[256,512] broadcast(mean), dimensions={0}
  c1 = f32[256,512] subtract(x, mb1)
  mb2 = f32[256,512] broadcast(mean), dimensions={0}
  c2 = f32[256,512] subtract(x, mb2)
  sq = f32[256,512] multiply(c2, c2)
  ssum = f32[256] reduce(sq, zero), dimensions={1}, to_apply=ADD
  var = f32[256] divide(ssum, nb)
  eps = f32[] constant(1e-5)
  epsb = f32[256] broadcast(eps), dimensions={}
  ve = f32[256] add(var, epsb)
  r = f32[256] rsqrt(ve)
  rb = f32[256,512] broadcast(r), dimensions={0}
  ROOT y = f32[256,512] multiply(c1, rb)
}
"""


def _names(module) -> set[str]:
    return {i.name for c in module.computations for i in c.instructions}


def test_a_repeated_chain_merges_whole_and_the_values_stay() -> None:
    module = parse_hlo_text(LAYER_NORM)
    merged = eliminate_common_subexpressions(module)
    names = _names(merged)
    assert {"mb2", "c2"}.isdisjoint(names) and {"mb1", "c1", "y"} <= names
    entry = next(c for c in merged.computations if c.id == merged.entry_computation_id)
    by_id = {i.id: i for i in entry.instructions}
    sq = next(i for i in entry.instructions if i.name == "sq")
    assert [by_id[o].name for o in sq.operand_ids] == ["c1", "c1"]
    assert len(_names(module)) == len(names) + 2  # the module read is left as it was
    inputs = make_inputs(module, seed=4)
    (before,), (after,) = evaluate(module, inputs), evaluate(merged, inputs)
    assert np.array_equal(before, after)


def test_random_numbers_and_tables_of_constants_keep_their_identity() -> None:
    """Two rng draws are two values; two cos tables of an iota (RoPE's, once for q and once for
    k) are computed where each is read rather than shared; the transposes differ by operand."""
    text = """HloModule kept
ENTRY main {
  a = f32[64,64] parameter(0)
  b = f32[64,64] parameter(1)
  lo = f32[] constant(0)
  hi = f32[] constant(1)
  r1 = f32[64,64] rng(lo, hi), distribution=rng_uniform
  r2 = f32[64,64] rng(lo, hi), distribution=rng_uniform
  s1 = f32[64,64] add(a, r1)
  s2 = f32[64,64] add(a, r2)
  i1 = f32[64,64] iota(), iota_dimension=0
  c1 = f32[64,64] cosine(i1)
  i2 = f32[64,64] iota(), iota_dimension=0
  c2 = f32[64,64] cosine(i2)
  q = f32[64,64] multiply(a, c1)
  k = f32[64,64] multiply(b, c2)
  t1 = f32[64,64] transpose(a), dimensions={1,0}
  t2 = f32[64,64] transpose(b), dimensions={1,0}
  ROOT out = (f32[64,64], f32[64,64], f32[64,64], f32[64,64], f32[64,64], f32[64,64])
    tuple(s1, s2, q, k, t1, t2)
}
"""
    module = parse_hlo_text(text)
    assert eliminate_common_subexpressions(module) is module  # nothing merges: the same module back
    # the same sums and products written twice do merge
    twice = parse_hlo_text(text.replace("add(a, r2)", "add(a, r1)").replace("multiply(b, c2)",
                                                                            "multiply(a, c1)"))
    assert {"s2", "k"}.isdisjoint(_names(eliminate_common_subexpressions(twice)))


def test_a_norm_written_twice_with_its_own_reducers_and_constants_merges_whole() -> None:
    """JAX's LLaMA layer normalizes x once for the queries and once for the keys and values; each
    sum has its own `add` computation and its own constant 0. The second norm merges into the first
    (its reduce too), and the constants, values of no parameter, stay where they are."""
    text = """HloModule twice
ADD_A { a = f32[] parameter(0)  b = f32[] parameter(1)  ROOT s = f32[] add(a, b) }
ADD_B { c = f32[] parameter(0)  d = f32[] parameter(1)  ROOT t = f32[] add(c, d) }
ENTRY main {
  x = f32[128,256] parameter(0)
  z1 = f32[] constant(0)
  s1 = f32[128,256] multiply(x, x)
  r1 = f32[128] reduce(s1, z1), dimensions={1}, to_apply=ADD_A
  z2 = f32[] constant(0)
  s2 = f32[128,256] multiply(x, x)
  r2 = f32[128] reduce(s2, z2), dimensions={1}, to_apply=ADD_B
  ROOT out = (f32[128], f32[128]) tuple(r1, r2)
}
"""
    module = parse_hlo_text(text)
    merged = eliminate_common_subexpressions(module)
    names = _names(merged)
    assert {"s2", "r2"}.isdisjoint(names) and {"z1", "z2", "r1"} <= names
    inputs = make_inputs(module, seed=5)
    before, after = evaluate(module, inputs), evaluate(merged, inputs)
    assert len(before) == len(after) == 2
    assert all(np.array_equal(a, b) for a, b in zip(before, after, strict=True))


def test_the_layer_norm_computes_its_centred_rows_once_and_verifies(tmp_path: Path) -> None:
    program = lower_module(parse_hlo_text(LAYER_NORM))
    optimize(program, pass_list("", 2))
    centred = [st for nest in program.nests for st in nest.statements
               if st.source in ("c1", "c2") and st.op != "dma"]
    assert centred and {st.source for st in centred} == {"c1"}
    model = tmp_path / "layer_norm.hlo"
    model.write_text(LAYER_NORM)
    compiled = run_ncc("compile", str(model), "--output", str(tmp_path / "m.neff"), "--verify", timeout=300)
    assert compiled.returncode == 0, compiled.stderr
