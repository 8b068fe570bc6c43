"""reduce-precision and the batch norms (PyTorch/XLA's BatchNorm emits batch-norm-training,
-inference and -grad): verified, evaluated by the golden evaluator, expanded by the frontend into
ops it lowers, and compiled from the CLI to results a float64 numpy reference agrees with."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
from conftest import run_ncc

from ncc.tools.common.dtypes import bf16_to_f32, f32_to_bf16
from ncc.tools.common.errors import CompileError
from ncc.tools.hlo.composite_ops import reduce_precision
from ncc.tools.hlo.hlo_printer import print_module
from ncc.tools.hlo.hlo_text import parse_hlo_text
from ncc.tools.hlo.hlo_types import entry_computation
from ncc.tools.hlo.hlo_verify import verify_module
from ncc.tools.hlo2penguin.expand import expand_composites

BATCH_NORMS = """HloModule batch_norms

ENTRY main {{
  x = {a} parameter(0)
  scale = {v} parameter(1)
  offset = {v} parameter(2)
  dy = {a} parameter(3)
  train = ({a}, {v}, {v}) batch-norm-training(x, scale, offset), epsilon=0.001, feature_index=1
  y = {a} get-tuple-element(train), index=0
  mean = {v} get-tuple-element(train), index=1
  var = {v} get-tuple-element(train), index=2
  inf = {a} batch-norm-inference(x, scale, offset, mean, var), epsilon=0.001, feature_index=1
  grad = ({a}, {v}, {v}) batch-norm-grad(x, scale, mean, var, dy), epsilon=0.001, feature_index=1
  dx = {a} get-tuple-element(grad), index=0
  dscale = {v} get-tuple-element(grad), index=1
  doffset = {v} get-tuple-element(grad), index=2
  ROOT out = ({a}, {v}, {v}, {a}, {a}, {v}, {v}) tuple(y, mean, var, inf, dx, dscale, doffset)
}}
""".format(a="f32[4,6,5,3]", v="f32[6]")


def precision_module(kind: str, exponent_bits: int, mantissa_bits: int, shape: str = "[64,32]") -> str:
    return f"""HloModule reduce_precision

ENTRY main {{
  x = {kind}{shape} parameter(0)
  ROOT r = {kind}{shape} reduce-precision(x), exponent_bits={exponent_bits}, mantissa_bits={mantissa_bits}
}}
"""


def compile_and_run(tmp_path: Path, text: str, inputs: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
    """`ncc compile --verify` (the golden evaluator's own definition agrees), then `ncc run`."""
    model, neff = tmp_path / "model.hlo", tmp_path / "model.neff"
    model.write_text(text)
    done = run_ncc("compile", str(model), "--output", str(neff), "--verify")
    assert done.returncode == 0, done.stderr
    np.savez(tmp_path / "in.npz", **inputs)
    inputs_file, outputs_file = tmp_path / "in.npz", tmp_path / "out.npz"
    ran = run_ncc("run", str(neff), "--inputs", str(inputs_file), "--output", str(outputs_file))
    assert ran.returncode == 0, ran.stderr
    return dict(np.load(outputs_file))


def special_values(rng: np.random.Generator) -> np.ndarray:
    x = rng.standard_normal((64, 32)).astype(np.float32) * np.float32(1000)
    x.flat[:12] = [np.nan, np.inf, -np.inf, 0.0, -0.0, 65504.0, 65520.0, -70000.0, 6e-5, -1e-6, 3e38, 1e-40]
    return x


def test_reduce_precision_to_f16_and_bf16_widths_is_their_rounding() -> None:
    x = special_values(np.random.default_rng(0))
    normal = np.abs(x) >= np.float32(2.0**-14)  # f16's denormals are flushed by reduce-precision
    to_f16 = reduce_precision(x, 5, 10)
    with np.errstate(over="ignore"):  # numpy's own cast warns where f16 overflows to inf
        as_f16 = x[normal].astype(np.float16).astype(np.float32)
    assert np.array_equal(to_f16[normal], as_f16, equal_nan=True)
    assert np.all(to_f16[~normal & np.isfinite(x)] == 0)
    assert np.array_equal(np.signbit(to_f16[~normal]), np.signbit(x[~normal]))
    assert np.array_equal(reduce_precision(x, 8, 7), bf16_to_f32(f32_to_bf16(x)), equal_nan=True)
    assert np.array_equal(reduce_precision(x, 8, 23), x, equal_nan=True)


@pytest.mark.parametrize(("kind", "exponent_bits", "mantissa_bits"),
                         [("f32", 5, 10), ("f32", 8, 7), ("f32", 3, 0), ("bf16", 5, 2)])
def test_reduce_precision_compiles_to_the_same_bits(tmp_path: Path, kind: str, exponent_bits: int,
                                                    mantissa_bits: int) -> None:
    x = special_values(np.random.default_rng(1))
    if kind == "bf16":
        x = bf16_to_f32(f32_to_bf16(x))
    got = compile_and_run(tmp_path, precision_module(kind, exponent_bits, mantissa_bits), {"arg0": x})["out0"]
    want = reduce_precision(x, exponent_bits, mantissa_bits)
    assert np.array_equal(np.isnan(got), np.isnan(want))
    finite = ~np.isnan(want)
    assert np.array_equal(got[finite].view(np.uint32), want[finite].view(np.uint32))


def test_batch_norms_compile_and_agree_with_a_float64_reference(tmp_path: Path) -> None:
    rng = np.random.default_rng(5)
    x = (rng.standard_normal((4, 6, 5, 3)) * 2 + 3).astype(np.float32)
    scale, offset = rng.standard_normal(6).astype(np.float32), rng.standard_normal(6).astype(np.float32)
    dy = rng.standard_normal((4, 6, 5, 3)).astype(np.float32)
    got = compile_and_run(tmp_path, BATCH_NORMS, {"arg0": x, "arg1": scale, "arg2": offset, "arg3": dy})
    wide, axes, shape, count, eps = x.astype(np.float64), (0, 2, 3), (1, 6, 1, 1), 4 * 5 * 3, 1e-3
    mean, var = wide.mean(axes), wide.var(axes)
    normalized = (wide - mean.reshape(shape)) / np.sqrt(var.reshape(shape) + eps)
    y = normalized * scale.reshape(shape) + offset.reshape(shape)
    grad_offset, grad_scale = dy.sum(axes, dtype=np.float64), (dy * normalized).sum(axes)
    grad_x = scale.reshape(shape) / np.sqrt(var.reshape(shape) + eps) / count * (
        count * dy - grad_offset.reshape(shape) - normalized * grad_scale.reshape(shape))
    for k, want in enumerate([y, mean, var, y, grad_x, grad_scale, grad_offset]):
        np.testing.assert_allclose(got[f"out{k}"], want, rtol=1e-5, atol=1e-5 * np.abs(want).max())


def test_the_expansion_leaves_no_composite_op_and_keeps_the_root() -> None:
    module = parse_hlo_text(BATCH_NORMS)
    expanded = expand_composites(module)
    verify_module(expanded)
    opcodes = {i.opcode for c in expanded.computations for i in c.instructions}
    assert not {op for op in opcodes if op.startswith("batch-norm")}
    assert entry_computation(expanded).root_id == entry_computation(module).root_id
    assert expand_composites(expanded) is expanded  # nothing left to do: the module itself


def test_epsilon_and_feature_index_survive_printing_and_parsing() -> None:
    printed = print_module(parse_hlo_text(BATCH_NORMS))
    assert "epsilon=0.001" in printed and "feature_index=1" in printed
    again = parse_hlo_text(printed)
    norms = [i for c in again.computations for i in c.instructions if i.opcode.startswith("batch-norm")]
    assert len(norms) == 3 and all(i.feature_index == 1 and abs(i.epsilon - 1e-3) < 1e-9 for i in norms)


@pytest.mark.parametrize(("old", "new", "code", "says"), [
    ("epsilon=0.001, feature_index=1\n  y", "epsilon=0.001, feature_index=4\n  y", "E203", "feature_index 4"),
    ("batch-norm-training(x, scale, offset)", "batch-norm-training(x, scale)", "E202", "takes 3 operands"),
    ("batch-norm-inference(x, scale, offset, mean, var)", "batch-norm-inference(x, scale, offset, var, x)",
     "E203", "one value per feature"),
])
def test_malformed_batch_norms_get_a_coded_error(old: str, new: str, code: str, says: str) -> None:
    assert old in BATCH_NORMS
    with pytest.raises(CompileError) as error:
        verify_module(parse_hlo_text(BATCH_NORMS.replace(old, new, 1)))
    assert error.value.code == code and says in str(error.value)


def test_reduce_precision_of_integers_is_refused() -> None:
    with pytest.raises(CompileError) as error:
        verify_module(parse_hlo_text(precision_module("s32", 5, 10)))
    assert error.value.code == "E203" and "floating-point" in str(error.value)


BATCH_GROUPS = """HloModule batch_groups

ENTRY main {
  x = f32[6,7,7,4] parameter(0)
  w = f32[3,3,4,6] parameter(1)
  ROOT y = f32[2,5,5,6] convolution(x, w), window={size=3x3}, dim_labels=b01f_01io->b01f, batch_group_count=3
}
"""


def test_a_batch_grouped_convolution_compiles_to_its_grouped_sums(tmp_path: Path) -> None:
    """batch_group_count 3 (jax.grad's weight gradient of a grouped convolution): output feature
    group g sums over the g-th run of two batch elements (g-major, as XLA's evaluator indexes)."""
    rng = np.random.default_rng(2)
    x = rng.standard_normal((6, 7, 7, 4)).astype(np.float32)
    w = rng.standard_normal((3, 3, 4, 6)).astype(np.float32)
    got = compile_and_run(tmp_path, BATCH_GROUPS, {"arg0": x, "arg1": w})["out0"]
    windows = np.lib.stride_tricks.sliding_window_view(x.astype(np.float64), (3, 3), axis=(1, 2))
    want = np.concatenate([np.einsum("bhwcij,ijco->bhwo", windows[2 * g:2 * g + 2], w[..., 2 * g:2 * g + 2])
                           for g in range(3)], axis=-1)
    np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-4)


BOTH_GROUPS = BATCH_GROUPS.replace("w = f32[3,3,4,6]", "w = f32[3,3,2,6]").replace(
    "batch_group_count=3", "batch_group_count=3, feature_group_count=2")


NOT_A_DIVISOR = BATCH_GROUPS.replace("batch_group_count=3", "batch_group_count=4")


@pytest.mark.parametrize("text", [NOT_A_DIVISOR, BOTH_GROUPS], ids=["not-a-divisor", "with-feature-groups"])
def test_batch_groups_that_do_not_divide_or_meet_feature_groups_are_refused(text: str) -> None:
    with pytest.raises(CompileError) as error:
        verify_module(parse_hlo_text(text))
    assert error.value.code == "E203" and "batch_group_count" in str(error.value)
