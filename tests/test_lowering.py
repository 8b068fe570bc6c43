"""HLO → Penguin → BIR on real models: tiling, partial tiles, engine selection, free layout ops."""

from __future__ import annotations

from collections import Counter
from pathlib import Path

import numpy as np
import pytest

from ncc.schemas import bir_pb2, common_pb2, hlo_pb2
from ncc.tools.hlo2penguin.lower import lower_module
from ncc.tools.hlo_opt.bir_codegen import lower_to_bir


def lower(models_dir: Path, name: str) -> bir_pb2.Program:
    module = hlo_pb2.HloModuleProto()
    module.ParseFromString((models_dir / f"{name}.hlo.pb").read_bytes())
    return lower_to_bir(lower_module(module))


def accesses(program: bir_pb2.Program):
    for instr in program.instructions:
        for ap in list(instr.outputs) + list(instr.inputs):
            yield instr, ap


def test_partial_partition_tile(models_dir: Path) -> None:
    """layernorm has 200 rows: every row-tiled op runs on a 128-row tile and a 72-row tile."""
    program = lower(models_dir, "layernorm")
    sbuf = [ap for _, ap in accesses(program) if ap.memory == common_pb2.SBUF]
    rows = [ap for ap in sbuf if ".row" in ap.tensor]  # gamma and beta: HBM reads them into one partition
    assert rows and all(ap.partition_count == 1 for ap in rows)
    counts = Counter(ap.partition_count for ap in sbuf if ".row" not in ap.tensor)
    assert set(counts) == {128, 72}
    assert counts[128] == counts[72]


def test_engine_selection(models_dir: Path) -> None:
    program = lower(models_dir, "attention")
    engines = {instr.op: instr.engine for instr in program.instructions}
    assert engines["matmul"] == common_pb2.PE
    assert engines["activation"] == common_pb2.ACT  # exp
    assert engines["tensor_reduce"] == common_pb2.DVE
    for instr in program.instructions:
        if instr.op == "matmul":
            assert instr.outputs[0].memory == common_pb2.PSUM
        if instr.engine == common_pb2.POOL:
            assert all(ap.memory != common_pb2.PSUM for ap in list(instr.outputs) + list(instr.inputs))


def test_layout_ops_cost_no_copies(models_dir: Path) -> None:
    """attention's transpose, reshapes and broadcasts fold into DMA access patterns."""
    program = lower(models_dir, "attention")
    assert not [i for i in program.instructions if "copy" in i.name]
    # the transposed K is read through a strided DMA straight into the matmul's moving tile
    loads = [i for i in program.instructions if i.op == "dma" and i.inputs[0].memory == common_pb2.HBM]
    assert any(ap.dims[-1].stride != 1 for i in loads for ap in i.inputs)


def test_matmul_accumulates_over_k_tiles(models_dir: Path) -> None:
    """matmul contracts over K = 256: two 128-row matmuls, the second accumulating in PSUM."""
    program = lower(models_dir, "matmul")
    matmuls = [i for i in program.instructions if i.op == "matmul"]
    assert [m.accumulate for m in matmuls] == [False, True]
    assert len({m.outputs[0].tensor for m in matmuls}) == 1
    stationary, moving = matmuls[0].inputs
    assert (stationary.partition_count, stationary.dims[0].count) == (128, 128)
    assert (moving.partition_count, moving.dims[0].count) == (128, 512)


@pytest.mark.parametrize("name", ["rmsnorm", "gelu", "block"])
def test_scalar_constants_fold_into_immediates(models_dir: Path, name: str) -> None:
    program = lower(models_dir, name)
    assert not [t for t in program.hbm if t.role == bir_pb2.CONSTANT]
    assert any(i.op == "tensor_scalar" for i in program.instructions)


def test_frontend_attributes_stay_on_the_ops_they_lower_to() -> None:
    """An annotation JAX puts on an op (set_xla_metadata) reaches every Penguin statement and BIR
    instruction that op became, and nothing else."""
    from ncc.tools.hlo.hlo_text import parse_hlo_text

    module = parse_hlo_text(
        """HloModule annotated
ENTRY main {
  x = f32[256,300] parameter(0)
  e = f32[256,300] exponential(x), frontend_attributes={pipeline_stages="2",note="hot"}
  ROOT n = f32[256,300] negate(e)
}"""
    )
    program = lower_module(module)
    annotated = [n for n in program.nests if n.source == "e"]
    assert annotated and annotated[0].attributes["frontend:pipeline_stages"] == "2"
    for nest in program.nests:
        for statement in nest.statements:
            expected = {"frontend:pipeline_stages": "2", "frontend:note": "hot"} if nest.source == "e" else {}
            got = {k: v for k, v in statement.attributes.items() if k.startswith("frontend:")}
            assert got == expected, (nest.name, statement.name)
    bir = lower_to_bir(program)
    tagged = {i.source for i in bir.instructions if i.attributes.get("frontend:note") == "hot"}
    assert tagged == {"e"}


@pytest.mark.parametrize(("length", "rows"), [(1_000_000, 125), (1000, 125), (1024, 128), (1009, 1), (7, 7)])
def test_vectors_fill_the_partitions(length: int, rows: int) -> None:
    """A rank-1 op tiles as (p, n/p) with p the largest divisor of n up to 128, not n rows of one."""
    from ncc.tools.hlo.hlo_text import parse_hlo_text

    module = parse_hlo_text(f"""HloModule v
ENTRY main {{
  x = f32[{length}] parameter(0)
  ROOT e = f32[{length}] exponential(x)
}}""")
    program = lower_to_bir(lower_module(module))
    computes = [i for i in program.instructions if i.op == "activation"]
    assert {i.outputs[0].partition_count for i in computes} == {rows}
    assert sum(i.outputs[0].partition_count * i.outputs[0].dims[0].count for i in computes) == length


def test_folded_constants_take_their_type() -> None:
    """convert(2.7) to s32 folds to 2 and 1/3 in bf16 folds to bf16's nearest value, as XLA computes."""
    from ncc.tools.common.dtypes import bf16_to_f32, f32_to_bf16
    from ncc.tools.hlo.hlo_text import parse_hlo_text

    module = parse_hlo_text("""HloModule fold
ENTRY main {
  x = f32[4,8] parameter(0)
  c = f32[] constant(2.7)
  i = s32[] convert(c)
  f = f32[] convert(i)
  one = bf16[] constant(1)
  three = bf16[] constant(3)
  third = bf16[] divide(one, three)
  t = f32[] convert(third)
  ft = f32[] add(f, t)
  b = f32[4,8] broadcast(ft), dimensions={}
  ROOT r = f32[4,8] add(x, b)
}""")
    program = lower_module(module)
    (statement,) = [s for n in program.nests for s in n.statements if s.op == "tensor_scalar"]
    third = float(bf16_to_f32(f32_to_bf16(np.float32([1 / 3])))[0])
    assert statement.scalars[0] == pytest.approx(2.0 + third, abs=1e-7)


def test_tuple_parameter_is_refused_naming_it() -> None:
    from ncc.tools.common.errors import CompileError
    from ncc.tools.hlo.hlo_text import parse_hlo_text

    module = parse_hlo_text("""HloModule t
ENTRY main {
  p = (f32[4], f32[4]) parameter(0)
  a = f32[4] get-tuple-element(p), index=0
  ROOT r = f32[4] exponential(a)
}""")
    with pytest.raises(CompileError) as refused:
        lower_module(module)
    assert refused.value.code == "E207" and refused.value.location == "p"


def test_a_materialized_transpose_copies_whole_partition_tiles(models_dir: Path) -> None:
    """block's heads, [4, 128, 64] transposed to [128, 4, 64] and reshaped to [128, 256], need a
    copy: walked head by head it is 4 loads and 4 stores of [128, 64] tiles, not 128 of [4, 64]."""
    program = lower(models_dir, "block")
    copies = [i for i in program.instructions if i.name.startswith("reshape.7.copy")]
    assert len(copies) == 8
    assert all(ap.partition_count == 128 for i in copies for ap in [*i.inputs, *i.outputs]
               if ap.memory == common_pb2.SBUF)


def test_a_cumsum_lowers_to_log2_n_doubling_steps_not_n_window_offsets() -> None:
    """JAX's cumsum is a reduce-window as long as its axis: folded over every window offset it was
    n elementwise ops over the whole array (a cumsum over 32,000 columns passed the instruction
    budget); as a scan it is ceil(log2 n) steps of one add each."""
    from ncc.tools.hlo.hlo_text import parse_hlo_text

    def adds(n: int, init: str) -> int:
        text = f"""HloModule cumsum
add {{
  a = f32[] parameter(0)
  b = f32[] parameter(1)
  ROOT s = f32[] add(a, b)
}}
ENTRY main {{
  x = f32[2,{n}] parameter(0)
  z = f32[] constant({init})
  ROOT c = f32[2,{n}] reduce-window(x, z), window={{size=1x{n} pad=0_0x{n - 1}_0}}, to_apply=add
}}
"""
        program = lower_module(parse_hlo_text(text))
        return sum(st.func == "add" for nest in program.nests for st in nest.statements)

    assert adds(4000, "0") == 12 and adds(4096, "0") == 12 and adds(2, "0") == 1
    assert adds(40, "1") >= 40  # an init that is not add's identity folds every offset


def _pool_ops(reducer: str, window: str) -> int:
    """The reducer's elementwise operations a 2-D pool over f32[2, 24, 24, 8] lowers to."""
    from ncc.tools.hlo.hlo_text import parse_hlo_text

    init = "-inf" if reducer == "maximum" else "0"
    text = f"""HloModule pool
red {{
  a = f32[] parameter(0)
  b = f32[] parameter(1)
  ROOT s = f32[] {reducer}(a, b)
}}
ENTRY main {{
  x = f32[2,24,24,8] parameter(0)
  z = f32[] constant({init})
  ROOT p = f32[2,12,12,8] reduce-window(x, z),
    window={{size=1x{window}x1 stride=1x2x2x1 pad=0_0x1_1x1_1x0_0}}, to_apply=red
}}
"""
    program = lower_module(parse_hlo_text(text))
    return sum(st.func == reducer for nest in program.nests for st in nest.statements)


def test_a_3x3_max_pool_runs_one_dimension_at_a_time_and_a_3x3_sum_does_not() -> None:
    """Max and min take their window's elements in any grouping with the same values, so a 3x3
    max pool is 3 + 3 offsets: two maxima a pass (the first offset of each meets the init, -inf,
    which is no operation), not the eight of all nine offsets; a sum regrouped may round
    differently, so a 3x3 sum still folds its 9 offsets in order (x + 0.0 is an operation); a
    2x2 max folds as it is."""
    assert _pool_ops("maximum", "3x3") == 4 and _pool_ops("add", "3x3") == 9
    assert _pool_ops("maximum", "2x2") == 3
