"""The Penguin optimizer (tools/hlo_opt: fusion, cse, dce, retile) on programs lowered from small HLO modules,
and end to end from the CLI: fused programs still match the golden evaluator in the simulator,
move fewer HBM bytes, and what must not fuse stays apart."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
from conftest import run_ncc
from orchestrator_support import compile_and_run

from ncc.schemas import bir_pb2, common_pb2, penguin_pb2
from ncc.tools.common import dtypes
from ncc.tools.common.hbm_traffic import hbm_bytes
from ncc.tools.hlo.hlo_text import parse_hlo_text
from ncc.tools.hlo2penguin.lower import lower_module
from ncc.tools.hlo_opt.bir_codegen import lower_to_bir
from ncc.tools.hlo_opt.optimizer import optimize, pass_list
from ncc.tools.hlo_opt.passes.broadcast_operands import fold_broadcast_operands
from ncc.tools.hlo_opt.passes.cse import eliminate_common_loads
from ncc.tools.hlo_opt.passes.dce import eliminate_dead_code
from ncc.tools.hlo_opt.passes.fusion import fuse_nests
from ncc.tools.hlo_opt.passes.invariant_loads import hoist_invariant_loads
from ncc.tools.hlo_opt.passes.retile import retile_nests

S = "f32[300,2100]"  # three partition tiles (one partial), two free tiles (one partial)
CHAIN = f"""HloModule chain
ENTRY main {{
  x = {S} parameter(0)
  y = {S} parameter(1)
  a = {S} multiply(x, x)
  b = {S} add(a, y)
  t = {S} tanh(b)
  c = {S} multiply(t, x)
  ROOT d = {S} subtract(c, y)
}}
"""


def lowered(text: str) -> penguin_pb2.Program:
    return lower_module(parse_hlo_text(text))


def hbm_bytes_loaded(program: penguin_pb2.Program) -> int:
    """Bytes the program's tile loads read from HBM, counted over every iteration."""
    tensors = {t.name: t for t in program.tensors}
    total = 0
    for nest in program.nests:
        points = int(np.prod([a.extent for a in nest.axes]))
        for st in nest.statements:
            if st.op == "dma" and tensors[st.inputs[0].tensor].memory == common_pb2.HBM:
                total += points * int(np.prod(st.inputs[0].extents)) * dtypes.itemsize(
                    tensors[st.inputs[0].tensor].dtype)
    return total


def test_an_elementwise_chain_becomes_one_nest_that_loads_each_input_once() -> None:
    program = lowered(CHAIN)
    assert len(program.nests) == 5
    before = hbm_bytes_loaded(program)
    fusion = fuse_nests(program)
    assert (fusion.nests_before, fusion.nests_after, fusion.loads_removed) == (5, 1, 4)
    cse = eliminate_common_loads(program)
    assert cse.loads_removed == 2  # x and y once more each (x*x loads x once)
    dce = eliminate_dead_code(program)
    assert dce.statements_removed == 4  # the four intermediates' stores
    stores = [st for st in program.nests[0].statements if st.name.endswith("store")]
    assert len(stores) == 1
    # x and y, each read once (the padded last tiles count whole, so compare with the tile grid)
    assert hbm_bytes_loaded(program) * 4 == before  # 8 loads of one shape before, 2 after


def test_a_consumer_reading_through_another_view_is_not_fused() -> None:
    """A transpose reads the producer's output in another order: it needs all of it first."""
    program = lowered("""HloModule t
ENTRY main {
  x = f32[256,256] parameter(0)
  e = f32[256,256] exponential(x)
  t = f32[256,256] transpose(e), dimensions={1,0}
  ROOT n = f32[256,256] negate(t)
}
""")
    assert fuse_nests(program).nests_after == 2


def test_a_consumer_writing_into_the_producers_tensor_is_not_fused() -> None:
    """dynamic-update-slice at a constant start: a copy of the operand, then the update over part of
    it; the second nest writes the tensor the first stores, so they stay in order, apart."""
    program = lowered("""HloModule u
ENTRY main {
  x = f32[256,64] parameter(0)
  u = f32[128,64] parameter(1)
  e = f32[256,64] exponential(x)
  zero = s32[] constant(0)
  start = s32[] constant(128)
  ROOT d = f32[256,64] dynamic-update-slice(e, u, start, zero)
}
""")
    fuse_nests(program)
    tensors = {t.name: t for t in program.tensors}
    (result,) = [t.name for t in program.tensors if t.role == penguin_pb2.OUTPUT]
    writers = [n.name for n in program.nests if any((tensors[a.tensor].view_of or a.tensor) == result
                                                    for st in n.statements for a in st.outputs)]
    assert len(writers) == 2  # the operand's copy (fused with exp) and the update, still two nests


def test_dead_code_keeps_an_intermediate_that_is_also_an_output() -> None:
    program = lowered(f"""HloModule o
ENTRY main {{
  x = {S} parameter(0)
  e = {S} exponential(x)
  n = {S} negate(e)
  ROOT r = ({S}, {S}) tuple(e, n)
}}
""")
    optimize(program, ["fusion", "cse", "dce"])
    (nest,) = program.nests
    assert sum(st.name.endswith("store") for st in nest.statements) == 2


def test_pass_list_defaults_and_refusals() -> None:
    from ncc.tools.common.errors import CompileError

    assert pass_list("", 0) == []
    assert pass_list("", 2) == [
        "fusion", "cse", "act_functions", "broadcast_operands", "dce", "retile", "tile_order", "epilogues",
        "pipeline", "invariant_loads", "forward", "direct_copies", "act_operands", "dce",
    ]
    assert pass_list("none", 2) == [] and pass_list("dce", 0) == ["dce"]
    with pytest.raises(CompileError) as info:
        pass_list("fusion,bogus", 2)
    assert info.value.code == "E400" and "bogus" in info.value.message
    with pytest.raises(CompileError) as info:
        pass_list("retile{min_width=1}", 2)  # one-element tiles: thousands of instructions, no gain
    assert info.value.code == "E400"
    assert "min_width of Penguin pass 'retile' must be at least 32" in info.value.message
    assert pass_list("retile{min_width=32,min_tiles=1}", 2) == ["retile{min_width=32,min_tiles=1}"]


def _bir_dma_bytes(workdir: Path) -> int:
    bir = bir_pb2.Program()
    bir.ParseFromString(next(workdir.glob("*_Frontend/bir.pb")).read_bytes())
    return sum(hbm_bytes(bir).values())


def _verified_dma_bytes(tmp_path: Path, text: str, variants: dict[str, list[str]]) -> dict[str, int]:
    """Compile `text` with --verify once per variant (its extra flags): HBM bytes each one's dmas move."""
    model = tmp_path / "model.hlo"
    model.write_text(text)
    moved = {}
    for name, flags in variants.items():
        neff = tmp_path / f"{name}.neff"
        compiled = run_ncc("compile", str(model), "--output", str(neff), "--verify", *flags, timeout=300)
        assert compiled.returncode == 0, compiled.stderr
        moved[name] = _bir_dma_bytes(tmp_path / f"{name}.ncc-work")
    return moved


@pytest.mark.slow
def test_fused_chain_verifies_from_the_cli_and_moves_the_minimum(tmp_path: Path) -> None:
    moved = _verified_dma_bytes(tmp_path, CHAIN, {"fused": [], "unfused": ["--penguin-passes=none"]})
    minimum = 3 * 300 * 2100 * 4  # two inputs, one output
    assert moved["fused"] == minimum
    assert moved["unfused"] > 3 * minimum
    log = next((tmp_path / "fused.ncc-work").glob("*_Frontend/stderr.log")).read_text()
    assert "penguin-opt: fusion" in log


def softmax_of_masked(heads: int, rows: int, width: int) -> str:
    """The HLO lines of a softmax over the rows of `masked` (f32[heads, rows, width]), to the end
    of the entry computation."""
    scores, stats = f"f32[{heads},{rows},{width}]", f"f32[{heads},{rows}]"
    return f"""  ninf = f32[] constant(-inf)
  mx = {stats} reduce(masked, ninf), dimensions={{2}}, to_apply=MAX
  mxb = {scores} broadcast(mx), dimensions={{0,1}}
  sub = {scores} subtract(masked, mxb)
  e = {scores} exponential(sub)
  zero = f32[] constant(0)
  sum = {stats} reduce(e, zero), dimensions={{2}}, to_apply=ADD
  sumb = {scores} broadcast(sum), dimensions={{0,1}}
  ROOT p = {scores} divide(e, sumb)
}}
"""


MASKED_SOFTMAX = """HloModule masked_softmax
ADD { a = f32[] parameter(0)  b = f32[] parameter(1)  ROOT s = f32[] add(a, b) }
MAX { a = f32[] parameter(0)  b = f32[] parameter(1)  ROOT m = f32[] maximum(a, b) }
ENTRY main {
  s = f32[8,256,512] parameter(0)
  keep = s32[512] parameter(1)
  c = f32[] constant(0.125)
  cb = f32[8,256,512] broadcast(c), dimensions={}
  scaled = f32[8,256,512] multiply(s, cb)
  keepf = f32[512] convert(keep)
  one = f32[] constant(1)
  oneb = f32[512] broadcast(one), dimensions={}
  drop = f32[512] subtract(oneb, keepf)
  big = f32[] constant(-10000)
  bigb = f32[512] broadcast(big), dimensions={}
  bias = f32[512] multiply(drop, bigb)
  biasb = f32[8,256,512] broadcast(bias), dimensions={2}
  masked = f32[8,256,512] add(scaled, biasb)
""" + softmax_of_masked(8, 256, 512)


def test_a_masked_softmax_is_one_nest_over_row_tiles() -> None:
    """BERT's attention softmax: the mask's nests (computed from an input between the scaling and
    the mask's addition) move before the scaling, and every step of the softmax, its two row
    reductions included, joins one nest over the scores' row tiles."""
    program = lowered(MASKED_SOFTMAX)
    before = len(program.nests)
    stats = fuse_nests(program)
    assert stats.nests_moved >= 1
    softmax = program.nests[-1]  # the mask's nests first, then the scores' whole row chain
    assert [st.op for st in softmax.statements].count("tensor_reduce") == 2
    assert any(st.op == "activation" for st in softmax.statements)  # the exponential
    assert len(program.nests) < before - 6


@pytest.mark.slow
def test_a_fused_masked_softmax_verifies_from_the_cli_reading_the_scores_once(tmp_path: Path) -> None:
    moved = _verified_dma_bytes(tmp_path, MASKED_SOFTMAX, {"fused": [], "unfused": ["--penguin-passes=none"]})
    scores = 8 * 256 * 512 * 4  # 32 KiB a partition: more than forwarding keeps on chip
    assert moved["fused"] <= 2 * scores + 3 * 4 * 512  # read once, written once; the mask's vectors
    assert moved["unfused"] > 6 * scores


def test_unknown_penguin_pass_from_the_cli_is_e400(tmp_path: Path) -> None:
    model = tmp_path / "chain.hlo"
    model.write_text(CHAIN)
    compiled = run_ncc("compile", str(model), "--output", str(tmp_path / "m.neff"), "--penguin-passes=fuse",
                       timeout=120)
    assert compiled.returncode != 0 and "[E400]" in compiled.stderr and "fuse" in compiled.stderr
    assert "Traceback" not in compiled.stderr


def test_a_norm_body_becomes_one_nest(models_dir: Path) -> None:
    """layernorm's row sums fit one free tile: the nest's second axis has extent 1, so the store
    that waited for the last column tile happens at every point, and what uses the sums joins the
    reduction's nest. The mean and the scale, read back from HBM broadcast across each row, become
    on-chip broadcasts of their [128, 1] tiles on ACT (BIR: an input access of stride 0)."""
    from ncc.tools.hlo.hlo_reader import load_module

    program = lower_module(load_module(str(models_dir / "layernorm.hlo.pb")))
    assert len(program.nests) == 11  # x - mean, written twice, is one (hlo_cse.py)
    fuse_nests(program)
    (nest,) = program.nests
    assert all(not st.predicates for st in nest.statements)
    broadcasts = [st for st in nest.statements if st.attributes.get("broadcast") == "0"]
    assert len(broadcasts) == 2 and all(st.op == "tensor_copy" for st in broadcasts)
    assert all(st.engine == common_pb2.ACT for st in broadcasts)
    bir = lower_to_bir(program)
    spread = [i for i in bir.instructions if i.op == "tensor_copy" and i.engine == common_pb2.ACT]
    assert spread and all((i.inputs[0].dims[0].stride, i.inputs[0].dims[0].count) == (0, 768) for i in spread)


# A dense layer's bias: b broadcast along the rows of a 300-row x (three row tiles, one partial)
BIAS = """HloModule bias
ENTRY main {
  x = f32[300,640] parameter(0)
  b = f32[640] parameter(1)
  bb = f32[300,640] broadcast(b), dimensions={1}
  s = f32[300,640] add(x, bb)
  ROOT t = f32[300,640] tanh(s)
}
"""


DENSE_BIAS = """HloModule dense_bias
ENTRY main {
  x = f32[1,512,768] parameter(0)
  w = f32[768,3072] parameter(1)
  b = f32[3072] parameter(2)
  y = f32[1,512,3072] dot(x, w), lhs_contracting_dims={2}, rhs_contracting_dims={0}
  bb = f32[1,512,3072] broadcast(b), dimensions={2}
  z = f32[1,512,3072] add(y, bb)
  ROOT t = f32[1,512,3072] tanh(z)
}
"""


def test_a_dense_layer_s_bias_is_loaded_once_per_column_tile_in_one_row_block() -> None:
    """tile_order splits the four row tiles into io (one block, extent 1) and ii: the bias tile's
    rows start at 512·io + 128·ii, one block a step of ii since io is always 0, so the bias loads
    at ii == 0 only (BERT's feed-forward bias loaded 6.3 MB where 1.6 MB carry it)."""
    program = lowered(DENSE_BIAS)
    optimize(program, pass_list("", 2))
    tensors = {t.name: t for t in program.tensors}
    nest = next(n for n in program.nests if any(st.op == "matmul" for st in n.statements))
    assert {axis.name: axis.extent for axis in nest.axes}.get("io") == 1
    (bias,) = [st for st in nest.statements if st.op == "dma" and tensors[st.inputs[0].tensor].view_of == "b"]
    assert any([(t.var, t.coeff) for t in p.expr.terms] == [("ii", 1)] and p.expr.constant == 0
               for p in bias.predicates)


def test_a_broadcast_bias_is_loaded_once_per_column_tile_not_once_per_row_tile() -> None:
    program = lowered(BIAS)
    optimize(program, ["fusion", "cse", "dce"])
    tensors = {t.name: t for t in program.tensors}
    (nest,) = program.nests
    bias_loads = [st for st in nest.statements if st.op == "dma"
                  and tensors[st.inputs[0].tensor].view_of == "b"]
    assert len(bias_loads) == 1 and not bias_loads[0].predicates
    rows = next(axis for axis in nest.axes if axis.extent == 3)
    before = len(lower_to_bir(program).instructions)
    stats = hoist_invariant_loads(program)
    assert (stats.loads_hoisted, stats.tiles_replicated) == (1, 1)
    (predicate,) = bias_loads[0].predicates
    assert [(t.var, t.coeff) for t in predicate.expr.terms] == [(rows.name, 1)]
    tile = tensors[bias_loads[0].outputs[0].tensor]
    assert list(tile.replicated_dims) == [0]
    bir = lower_to_bir(program)
    loads = [i for i in bir.instructions if i.op == "dma" and i.inputs[0].tensor == "b"]
    spreads = [i for i in bir.instructions if i.name.endswith(".broadcast")]  # the row to 128 partitions
    assert len(spreads) == len(loads)
    assert len(bir.instructions) == before - 2 * 2 * len(loads)  # the two other row tiles' pairs are gone
    # every row tile (the partial last one too) reads the one buffer the first row tile filled
    readers = {ap.tensor for i in bir.instructions if i.op != "dma" for ap in i.inputs
               if ap.tensor.startswith(tile.name)}
    assert readers == {ap.tensor for i in spreads for ap in i.outputs}
    partial = [ap for i in bir.instructions for ap in i.inputs if ap.tensor in readers
               and ap.partition_count == 300 - 256]
    assert partial and all(ap.partition_start == 0 for ap in partial)


def test_a_load_whose_tile_another_statement_writes_is_not_hoisted() -> None:
    program = lowered(BIAS)
    optimize(program, ["fusion", "cse", "dce"])
    tensors = {t.name: t for t in program.tensors}
    (nest,) = program.nests
    load = next(st for st in nest.statements
                if st.op == "dma" and tensors[st.inputs[0].tensor].view_of == "b")
    overwrite = nest.statements.add()
    overwrite.CopyFrom(load)
    overwrite.name, overwrite.op = "overwrite", "tensor_copy"
    overwrite.inputs[0].CopyFrom(load.outputs[0])
    assert hoist_invariant_loads(program).loads_hoisted == 0


def test_hoisted_bias_verifies_from_the_cli(tmp_path: Path) -> None:
    moved = _verified_dma_bytes(tmp_path, BIAS, {"hoisted": [], "plain": ["--penguin-passes=fusion,cse,dce"]})
    x_and_out = 2 * 300 * 640 * 4
    assert moved["plain"] == x_and_out + 3 * 640 * 4  # the bias row, once per row tile (spread on chip)
    assert moved["hoisted"] == x_and_out + 640 * 4  # once, for every row tile


# A select against a constant (GPT-2's causal mask fills -1e9 into every masked score)
MASKED_FILL = """HloModule masked
ENTRY main {
  x = f32[4,256,128] parameter(0)
  zero = f32[] constant(0)
  zb = f32[4,256,128] broadcast(zero), dimensions={}
  keep = pred[4,256,128] compare(x, zb), direction=GT
  big = f32[] constant(-1e9)
  bigb = f32[4,256,128] broadcast(big), dimensions={}
  ROOT y = f32[4,256,128] select(keep, x, bigb)
}
"""


def test_a_constant_fill_runs_once_not_once_per_tile(tmp_path: Path) -> None:
    """The select's -1e9 tile, filled at every (head, row tile) point, is filled at the first and
    read by all: the fill is an invariant 'load' with no source (GPT-2's causal mask: 85 us of
    POOL a layer)."""
    program = lowered(MASKED_FILL)
    passes = pass_list("", 2)
    optimize(program, passes[: passes.index("invariant_loads")])
    (nest,) = program.nests
    (fill,) = [st for st in nest.statements if st.op == "iota"]
    before = sum(1 for i in lower_to_bir(program).instructions if i.op == "iota")
    assert before == 8 and not fill.predicates  # 4 heads x 2 row tiles
    assert hoist_invariant_loads(program).loads_hoisted == 1
    assert sorted(t.var for q in fill.predicates for t in q.expr.terms) == sorted(
        a.name for a in nest.axes if a.extent > 1)
    assert sum(1 for i in lower_to_bir(program).instructions if i.op == "iota") == 1
    model = tmp_path / "masked.hlo"
    model.write_text(MASKED_FILL)
    compiled = run_ncc("compile", str(model), "--output", str(tmp_path / "m.neff"), "--verify", timeout=300)
    assert compiled.returncode == 0, compiled.stderr


def test_the_first_budget_check_counts_only_what_fusion_cannot_remove() -> None:
    """HLOToTensorizer checks the budget by what survives the Penguin optimizer (a long chain fuses
    to a fraction of its unfused size); the Frontend checks the exact count after the passes."""
    from ncc.tools.common.errors import CompileError
    from ncc.tools.common.penguin_budget import backend_instruction_count, check_budget

    program = lowered(CHAIN)
    unfused, _, _ = backend_instruction_count(program)
    surviving, _, _ = backend_instruction_count(program, surviving=True)
    optimize(program, ["fusion", "cse", "dce"])
    fused, _, _ = backend_instruction_count(program)
    assert surviving <= fused < unfused
    limit = fused
    program = lowered(CHAIN)
    check_budget(program, limit, surviving=True)
    with pytest.raises(CompileError) as info:
        check_budget(program, limit)
    assert info.value.code == "E302"
    optimize(program, ["fusion", "cse", "dce"])
    check_budget(program, limit)


GELU_LIKE = """HloModule short
ENTRY main {
  x = f32[256,1024] parameter(0)
  a = f32[256,1024] multiply(x, x)
  t = f32[256,1024] tanh(a)
  ROOT d = f32[256,1024] multiply(t, x)
}
"""
ROW_SUM = """HloModule rowsum
ENTRY main {
  x = f32[256,1024] parameter(0)
  e = f32[256,1024] exponential(x)
  z = f32[] constant(0)
  ROOT s = f32[256] reduce(e, z), dimensions={1}, to_apply=add
}
add {
  p = f32[] parameter(0)
  q = f32[] parameter(1)
  ROOT r = f32[] add(p, q)
}
"""


def _fused(text: str) -> penguin_pb2.Program:
    program = lowered(text)
    for step in (fuse_nests, eliminate_common_loads, eliminate_dead_code):
        step(program)
    return program


def test_a_short_elementwise_nest_gets_narrower_free_tiles() -> None:
    """[256, 1024] is two tiles of [128, 1024]: too few to overlap loads, compute and stores. The
    free tiles halve (512 is the narrowest by default), every on-chip block with them, and the
    BIR has twice the instructions, each over half the columns."""
    program = _fused(GELU_LIKE)
    (nest,) = program.nests
    before = len(lower_to_bir(program).instructions)
    stats = retile_nests(program)
    assert (stats.nests_retiled, stats.tiles_before, stats.tiles_after) == (1, 2, 4)
    assert [axis.extent for axis in nest.axes] == [2, 2]
    assert {t.block_shape[-1] for t in program.tensors if t.memory != common_pb2.HBM} == {512}
    bir = lower_to_bir(program)
    assert len(bir.instructions) == 2 * before
    assert {ap.dims[-1].count for i in bir.instructions if i.op != "dma" for ap in i.outputs} == {512}
    narrower = _fused(GELU_LIKE)
    assert retile_nests(narrower, min_tiles=16, min_width=128).tiles_after == 16


def test_a_nest_that_reduces_along_its_rows_keeps_its_tiles() -> None:
    program = _fused(ROW_SUM)
    assert retile_nests(program).nests_retiled == 0
    wide_enough = _fused(GELU_LIKE)
    assert retile_nests(wide_enough, min_tiles=2).nests_retiled == 0  # two tiles are enough


@pytest.mark.slow
def test_retiled_chain_with_partial_tiles_verifies_from_the_cli(tmp_path: Path) -> None:
    """CHAIN is [300, 2100]: 3 x 2 tiles of up to 2048 columns become 3 x 3 of up to 1024, the last
    one 52 wide; the simulator's result still matches the golden evaluator."""
    program = _fused(CHAIN)
    assert retile_nests(program).tiles_after == 9
    model = tmp_path / "chain.hlo"
    model.write_text(CHAIN)
    compiled = run_ncc("compile", str(model), "--output", str(tmp_path / "m.neff"), "--verify", timeout=300)
    assert compiled.returncode == 0, compiled.stderr
    log = next((tmp_path / "m.ncc-work").glob("*_Frontend/stderr.log")).read_text()
    assert "retile: RetileStats(nests_retiled=1, tiles_before=6, tiles_after=9)" in log


# A causal mask shared by every head, as wide as the scores: its row tiles take 9 x 8 KiB a
# partition, more than a hoisted load may keep on chip across the heads (KEEP_BUDGET_BYTES).
WIDE_MASK = """HloModule wide_mask
ADD { a = f32[] parameter(0)  b = f32[] parameter(1)  ROOT s = f32[] add(a, b) }
MAX { a = f32[] parameter(0)  b = f32[] parameter(1)  ROOT m = f32[] maximum(a, b) }
ENTRY main {
  s = f32[2,1152,2048] parameter(0)
  mask = f32[1152,2048] parameter(1)
  maskb = f32[2,1152,2048] broadcast(mask), dimensions={1,2}
  masked = f32[2,1152,2048] add(s, maskb)
""" + softmax_of_masked(2, 1152, 2048)


def test_a_mask_shared_by_the_heads_is_loaded_once_with_the_heads_inside_its_row_tiles() -> None:
    """The masked softmax is one nest over (head, row tile); the mask's load reads the same bytes
    for every head, but keeping all its row tiles across the head loop would take 72 KiB a
    partition. invariant_loads moves the head loop inside the row tiles' instead (no dependence
    runs between heads), so one mask tile is kept at a time and loaded once per row tile."""
    program = lowered(WIDE_MASK)
    optimize(program, pass_list("", 2))
    tensors = {t.name: t for t in program.tensors}
    (nest,) = [n for n in program.nests if any(st.op == "tensor_reduce" for st in n.statements)]
    (load,) = [st for st in nest.statements
               if st.op == "dma" and tensors[st.inputs[0].tensor].view_of == "mask"]
    (predicate,) = load.predicates
    (head,) = [term.var for term in predicate.expr.terms]
    names = [axis.name for axis in nest.axes]
    extents = {axis.name: axis.extent for axis in nest.axes}
    assert extents[head] == 2
    rows = next(name for name in names if extents[name] == 9)
    assert names.index(rows) < names.index(head)


@pytest.mark.slow
def test_a_mask_shared_by_the_heads_verifies_from_the_cli_read_once(tmp_path: Path) -> None:
    moved = _verified_dma_bytes(tmp_path, WIDE_MASK, {"fused": []})
    scores, mask = 2 * 1152 * 2048 * 4, 1152 * 2048 * 4
    assert moved["fused"] == 2 * scores + mask


def test_a_spread_row_max_becomes_the_subtraction_s_scalar_operand() -> None:
    """The softmax's row max and row sum, spread across each row on ACT only for DVE's subtract and
    divide, become those operations' per-partition scalar operands: the spreads go, and the
    operations read the [P, 1] tiles, which BIR reads with stride 0."""
    program = lowered(MASKED_SOFTMAX)
    optimize(program, [p for p in pass_list("", 2) if p != "act_operands"])  # which takes the subtract
    softmax = next(n for n in program.nests if any(st.op == "tensor_reduce" for st in n.statements))
    assert not [st for st in softmax.statements if st.op == "tensor_copy" and "broadcast" in st.attributes]
    folded = [st for st in softmax.statements if st.attributes.get("broadcast") == "1"]
    assert {(st.op, st.func) for st in folded} == {("tensor_tensor", "subtract"), ("tensor_tensor", "divide")}
    for st in folded:
        assert st.inputs[1].extents[-1] == 1 and st.outputs[0].extents[-1] > 1
    bir = lower_to_bir(program)
    reads = [i.inputs[1] for i in bir.instructions
             if i.op == "tensor_tensor" and i.func in ("subtract", "divide")]
    assert reads and all([(d.stride, d.count) for d in ap.dims] == [(0, 512)] for ap in reads)


def masked_softmax_runs(tmp_path: Path, without: str, seed: int) -> dict[str, dict]:
    """MASKED_SOFTMAX compiled with --verify by the default passes ("with") and without the pass
    `without` ("without"), each run on the same seeded inputs: per name, the run's report with
    its first output under "out0" (every run race- and deadlock-free)."""
    rng = np.random.default_rng(seed)
    inputs = {"arg0": rng.normal(0, 2, (8, 256, 512)).astype(np.float32),
              "arg1": rng.integers(0, 2, 512).astype(np.int32)}
    return runs_with_and_without(tmp_path, MASKED_SOFTMAX, inputs, without)


def runs_with_and_without(tmp_path: Path, text: str, inputs: dict[str, np.ndarray],
                          without: str) -> dict[str, dict]:
    """The HLO `text` compiled with --verify by the default passes ("with") and without the pass
    `without` ("without"), each run on `inputs`: per name, the run's report with its first output
    under "out0" (every run race- and deadlock-free)."""
    model = tmp_path / "model.hlo"
    model.write_text(text)
    arrays = tmp_path / "in.npz"
    np.savez(arrays, **inputs)
    passes = ",".join(p for p in pass_list("", 2) if p != without)
    return {name: compile_and_run(model, arrays, name, *flags)
            for name, flags in {"with": [], "without": [f"--penguin-passes={passes}"]}.items()}


@pytest.mark.slow
def test_folded_broadcast_operands_verify_from_the_cli_and_take_less_time(tmp_path: Path) -> None:
    runs = masked_softmax_runs(tmp_path, "broadcast_operands", seed=3)
    assert np.array_equal(runs["with"]["out0"], runs["without"]["out0"])  # the same operations, values
    assert runs["with"]["simulated_ns"] < runs["without"]["simulated_ns"]


# A batch norm's first half over channel-major tiles: the mean and scale are [C] vectors
# broadcast along the positions, which the tile plan puts on the free dimension.
CHANNEL_NORM = """HloModule channel_norm
ENTRY main {
  x = f32[4,28,28,64] parameter(0)
  mean = f32[64] parameter(1)
  scale = f32[64] parameter(2)
  m = f32[4,28,28,64] broadcast(mean), dimensions={3}
  s = f32[4,28,28,64] broadcast(scale), dimensions={3}
  d = f32[4,28,28,64] subtract(x, m)
  ROOT y = f32[4,28,28,64] multiply(d, s)
}
"""


def test_a_per_channel_vector_loads_one_column_and_becomes_a_scalar_operand() -> None:
    """The mean and scale reach the channel-major tiles through views whose free stride is 0;
    each load brings its [P, 1] column (one element a partition from HBM, not a row) and the
    subtract and multiply take it as their per-partition operand, read with stride 0."""
    program = lowered(CHANNEL_NORM)
    optimize(program, [p for p in pass_list("", 2) if p != "act_operands"])  # which moves the subtract
    (nest,) = program.nests
    columns = [st for st in nest.statements if st.op == "dma" and st.outputs[0].tensor.endswith(".column")]
    assert len(columns) == 2
    for load in columns:
        assert load.inputs[0].extents[-1] == 1 and load.outputs[0].extents[-1] == 1
    folded = [st for st in nest.statements if st.attributes.get("broadcast") == "1"]
    assert {st.func for st in folded} == {"subtract", "multiply"}
    bir = lower_to_bir(program)
    reads = [i.inputs[1] for i in bir.instructions if i.op == "tensor_tensor"]
    assert reads and all(ap.dims[-1].stride == 0 for ap in reads)
    loads = [i for i in bir.instructions if i.op == "dma" and ".column" in i.outputs[0].tensor]
    assert loads and all(i.inputs[0].dims[-1].count == 1 for i in loads)


def test_a_column_an_earlier_nest_computed_narrows_too() -> None:
    """A column another nest computed (twice the mean) narrows as an input's does (the scale)."""
    text = CHANNEL_NORM.replace("  m = f32[4,28,28,64] broadcast(mean)",
                                "  twice = f32[64] add(mean, mean)\n  m = f32[4,28,28,64] broadcast(twice)")
    program = lowered(text)
    optimize(program, [p for p in pass_list("", 2) if p != "act_operands"])
    loads = {st.inputs[0].tensor.split(".")[0]: st for n in program.nests for st in n.statements
             if st.op == "dma" and st.inputs and st.inputs[0].tensor.startswith(("twice", "scale"))}
    assert loads["twice"].outputs[0].extents[-1] == 1 and loads["scale"].outputs[0].extents[-1] == 1


@pytest.mark.slow
def test_per_channel_columns_verify_from_the_cli_move_less_and_take_less_time(tmp_path: Path) -> None:
    rng = np.random.default_rng(4)
    inputs = {"arg0": rng.normal(0, 2, (4, 28, 28, 64)).astype(np.float32),
              "arg1": rng.normal(0, 1, 64).astype(np.float32),
              "arg2": rng.normal(1, 0.1, 64).astype(np.float32)}
    runs = runs_with_and_without(tmp_path, CHANNEL_NORM, inputs, "broadcast_operands")
    assert np.array_equal(runs["with"]["out0"], runs["without"]["out0"])  # the same operations, values
    assert runs["with"]["simulated_ns"] < runs["without"]["simulated_ns"]
    moved = 2 * 4 * 28 * 28 * 64 * 4  # x read once, y written once
    assert runs["with"]["hbm_bytes"] < moved * 1.01 < runs["without"]["hbm_bytes"]


INPUT_MASK_FILL = """HloModule masked_fill
ENTRY main {
  s = f32[4,256,512] parameter(0)
  keep = pred[256,512] parameter(1)
  keeps = pred[4,256,512] broadcast(keep), dimensions={1,2}
  big = f32[] constant(-1e+09)
  bigs = f32[4,256,512] broadcast(big), dimensions={}
  ROOT masked = f32[4,256,512] select(keeps, s, bigs)
}
"""


def test_a_constant_fill_read_by_a_select_becomes_its_column_operand() -> None:
    """where(mask, s, -1e9): the -1e9 the select streamed from a full [P, 512] fill is one
    element per partition, read with stride 0; POOL streams two operands instead of three. (The
    mask is an input: a causal one built from iotas is no select at all, test_affine_masks.)"""
    program = lowered(INPUT_MASK_FILL)
    optimize(program, pass_list("", 2))
    select = next(st for n in program.nests for st in n.statements if st.op == "select")
    assert select.attributes.get("broadcast") == "2"
    fill = next(st for n in program.nests for st in n.statements
                if st.op == "iota" and st.outputs[0].tensor == select.inputs[2].tensor)
    assert fill.outputs[0].extents[-1] == 1 and fill.outputs[0].tensor.endswith(".column")
    bir = lower_to_bir(program)
    (selects,) = {tuple(d.stride for d in i.inputs[2].dims) for i in bir.instructions if i.op == "select"}
    assert selects[-1] == 0


def test_an_index_along_a_dimension_is_no_constant_fill() -> None:
    """An iota along the free dimension writes a different value in every column: it stays a full
    tile for the add that reads it (the rng lowering emits such counters beside their add; once
    narrowed, every column read the first, and `test_ops`' rng module came out wrong)."""
    program = lowered("""HloModule counters
ENTRY main {
  s = s32[256,512] parameter(0)
  i = s32[256,512] iota(), iota_dimension=1
  ROOT a = s32[256,512] add(s, i)
}
""")
    optimize(program, ["fusion", "dce"])  # the add reads the iota's tile, and nothing else does
    (nest,) = program.nests
    iota = next(st for st in nest.statements if st.op == "iota")
    add = next(st for st in nest.statements if st.func == "add")
    assert fold_broadcast_operands(program).fills_narrowed == 0
    assert "broadcast" not in add.attributes and iota.outputs[0].extents[-1] == 512


@pytest.mark.slow
def test_a_narrowed_fill_verifies_from_the_cli_with_the_same_values_in_less_time(tmp_path: Path) -> None:
    inputs = {"arg0": np.random.default_rng(8).normal(0, 1, (4, 256, 512)).astype(np.float32),
              "arg1": np.tril(np.ones((256, 512), dtype=bool))}
    runs = runs_with_and_without(tmp_path, INPUT_MASK_FILL, inputs, "broadcast_operands")
    assert np.array_equal(runs["with"]["out0"], runs["without"]["out0"])
    assert runs["with"]["engine_busy_ns"]["POOL"] < 0.8 * runs["without"]["engine_busy_ns"]["POOL"]
    # the mask tiles' loads bound this one, so POOL's lighter work does not shorten it
    assert runs["with"]["simulated_ns"] <= runs["without"]["simulated_ns"]


def test_a_relu_walks_its_norm_s_tiles_and_joins_its_nest(tmp_path: Path) -> None:
    """A ReLU after the channel-major norm would tile itself row-major ([128, 1024]); it follows
    the norm's plan instead, so fusion joins the two and the norm's output never goes to HBM.
    The compile matches the HLO evaluator under --verify."""
    text = CHANNEL_NORM.replace("ROOT y =", "y =").removesuffix("}\n") + """  zero = f32[] constant(0)
  zeros = f32[4,28,28,64] broadcast(zero), dimensions={}
  ROOT r = f32[4,28,28,64] maximum(y, zeros)
}
"""
    program = lowered(text)
    optimize(program, pass_list("", 2))
    assert len(program.nests) == 1
    assert [t.name for t in program.tensors if t.memory == common_pb2.HBM and t.role == penguin_pb2.INTERNAL
            and not t.view_of] == []
    model = tmp_path / "norm_relu.hlo"
    model.write_text(text)
    compiled = run_ncc("compile", str(model), "--output", str(tmp_path / "m.neff"), "--verify", timeout=300)
    assert compiled.returncode == 0, compiled.stderr


# A 3x3 convolution: its im2col columns are a copy nest (a load and a store per tile).
SMALL_CONV = """HloModule small_conv
ENTRY main {
  x = f32[2,12,12,16] parameter(0)
  w = f32[3,3,16,8] parameter(1)
  ROOT y = f32[2,12,12,8] convolution(x, w), window={size=3x3 pad=1_1x1_1}, dim_labels=b01f_01io->b01f
}
"""


def test_a_tile_loaded_only_to_be_stored_moves_hbm_to_hbm() -> None:
    program = lowered(SMALL_CONV)
    optimize(program, pass_list("", 2))
    tensors = {t.name: t for t in program.tensors}
    copies = [n for n in program.nests if all(st.op == "dma" for st in n.statements)]
    assert copies
    for nest in copies:
        for st in nest.statements:
            memories = {tensors[a.tensor].memory for a in (*st.inputs, *st.outputs)}
            assert memories == {common_pb2.HBM}, st.name
    bir = lower_to_bir(program)
    direct = [i for i in bir.instructions if i.op == "dma"
              and i.inputs[0].memory == i.outputs[0].memory == common_pb2.HBM]
    assert direct


@pytest.mark.slow
def test_direct_copies_verify_from_the_cli_with_half_the_transfers(tmp_path: Path) -> None:
    without = ",".join(p for p in pass_list("", 2) if p != "direct_copies")
    counts = {}
    for name, flags in {"direct": [], "staged": [f"--penguin-passes={without}"]}.items():
        model = tmp_path / "conv.hlo"
        model.write_text(SMALL_CONV)
        compiled = run_ncc("compile", str(model), "--output", str(tmp_path / f"{name}.neff"),
                           "--workdir", str(tmp_path / f"{name}.ncc-work"), "--verify", *flags, timeout=300)
        assert compiled.returncode == 0, compiled.stderr
        bir = bir_pb2.Program()
        bir.ParseFromString(next((tmp_path / f"{name}.ncc-work").glob("*_Frontend/bir.pb")).read_bytes())
        counts[name] = sum(i.op == "dma" for i in bir.instructions)
    assert counts["direct"] < counts["staged"]


WIDER_CONV = SMALL_CONV.replace("2,12,12,16", "4,40,40,16").replace("2,12,12,8", "4,40,40,8")


def test_a_direct_copy_takes_its_kernel_rows_into_one_dma(tmp_path: Path) -> None:
    """The im2col copy of a 3x3 convolution over 40x40 images moved one [40, 48] box per kernel
    row; its kernel-row loop joins the box ([3, 40, 48], 23 KiB), 160 dmas left for 16 queues.
    In BIR the destination's kernel rows and columns merge into one contiguous run of 144, so
    the dma is [40, 144] there and [40, 3, 48] in the padded input. The compile matches under
    --verify."""
    program = lowered(WIDER_CONV)
    optimize(program, pass_list("", 2))
    im2col = next(n for n in program.nests if len(n.statements) == 1 and n.statements[0].op == "dma"
                  and 3 in n.statements[0].outputs[0].extents)
    assert sorted(int(a.extent) for a in im2col.axes if a.extent > 1) == [4, 40]
    bir = lower_to_bir(program)
    (dma, *_) = [i for i in bir.instructions if i.name.startswith(im2col.name + "/")]
    assert [d.count for d in dma.outputs[0].dims] == [40, 144]
    assert [d.count for d in dma.inputs[0].dims] == [40, 3, 48]
    model = tmp_path / "conv.hlo"
    model.write_text(WIDER_CONV)
    compiled = run_ncc("compile", str(model), "--output", str(tmp_path / "c.neff"), "--verify", timeout=300)
    assert compiled.returncode == 0, compiled.stderr


def test_a_copy_whose_source_is_written_between_its_load_and_store_stays_staged() -> None:
    from ncc.tools.hlo_opt.passes.direct_copies import copy_directly

    program = lowered(SMALL_CONV)
    optimize(program, [p for p in pass_list("", 2) if p != "direct_copies"])
    tensors = {t.name: t for t in program.tensors}
    nest = next(n for n in program.nests if all(st.op == "dma" for st in n.statements))
    statements = list(nest.statements)
    load = next(st for st in statements if tensors[st.inputs[0].tensor].memory == common_pb2.HBM)
    clobber = penguin_pb2.Statement()
    clobber.CopyFrom(load)  # rewrites the load's source in place, between the load and the store
    clobber.name = "clobber"
    clobber.outputs[0].CopyFrom(load.inputs[0])
    position = statements.index(load) + 1
    del nest.statements[:]
    nest.statements.extend([*statements[:position], clobber, *statements[position:]])
    tile = load.outputs[0].tensor
    copy_directly(program)
    assert any(st.name == load.name for st in nest.statements)  # the load stays
    assert any(a.tensor == tile for st in nest.statements if st.name != load.name for a in st.inputs)
