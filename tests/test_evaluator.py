"""The golden evaluator: JAX's own outputs on every real model, and XLA semantics op by op."""

from __future__ import annotations

import json
import tracemalloc
from pathlib import Path

import numpy as np
import pytest

from ncc.schemas import common_pb2
from ncc.tools.common.dtypes import numpy_to_tensor, storage_to_user_array, tensor_to_numpy
from ncc.tools.common.errors import CompileError
from ncc.tools.common.protoio import write_proto
from ncc.tools.hlo.hlo_reader import load_module
from ncc.tools.hlo.hlo_text import parse_hlo_text
from ncc.tools.hlo_opt.golden.evaluator import evaluate, make_inputs
from ncc.tools.hlo_opt.golden.run import run_golden

MODELS = ["add_mul", "gelu", "matmul", "mlp", "rmsnorm", "softmax", "layernorm", "attention", "matmul_bf16",
          "block"]


def model_args(models_dir: Path, model: str) -> tuple[list[np.ndarray], np.ndarray]:
    data = np.load(models_dir / f"{model}.io.npz")
    count = len([k for k in data.files if k.startswith("arg")])
    return [data[f"arg{i}"] for i in range(count)], data["out0"]


@pytest.mark.parametrize("model", MODELS)
def test_model_matches_jax(models_dir: Path, model: str) -> None:
    args, expected = model_args(models_dir, model)
    bf16 = json.loads((models_dir / "index.json").read_text())[model]["args"][0][0] == "bfloat16"
    (got,) = evaluate(load_module(str(models_dir / f"{model}.hlo.pb")), args)
    assert got.shape == expected.shape and got.dtype == np.float32
    if bf16:
        np.testing.assert_allclose(got, expected, rtol=2e-2, atol=1e-3)
    else:
        np.testing.assert_allclose(got, expected, rtol=0, atol=1e-4)
    (from_text,) = evaluate(load_module(str(models_dir / f"{model}.hlo")), args)
    np.testing.assert_array_equal(from_text, got)


def test_every_model_evaluates_on_seeded_inputs(models_dir: Path) -> None:
    for model in MODELS:
        module = load_module(str(models_dir / f"{model}.hlo.pb"))
        outputs = evaluate(module, make_inputs(module, 0))
        finite = [np.all(np.isfinite(np.asarray(out, dtype=np.float64))) for out in outputs]
        assert outputs and all(finite), model


def run(body: str, *args: np.ndarray, regions: str = "") -> list[np.ndarray]:
    return evaluate(parse_hlo_text(f"HloModule t\n{regions}\nENTRY e {{\n{body}\n}}\n"), list(args))


def test_a_long_chain_holds_only_its_live_values() -> None:
    """200 ops on 1 MB arrays: each value is dropped after its last reader, so the evaluation's
    peak stays a few arrays (holding them all would be 200 MB)."""
    lines = ["HloModule chain", "ENTRY main {", "  x0 = f32[256,1024] parameter(0)"]
    lines += [f"  x{i} = f32[256,1024] add(x{i - 1}, x{max(0, i - 2)})" for i in range(1, 200)]
    lines += ["  ROOT x200 = f32[256,1024] tanh(x199)", "}"]
    module = parse_hlo_text("\n".join(lines))
    arg = np.full((256, 1024), 1e-30, np.float32)
    tracemalloc.start()
    try:
        (got,) = evaluate(module, [arg])
        _, peak = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    assert got.shape == (256, 1024) and np.isfinite(got).all()
    assert peak < 20 * arg.nbytes, peak


def test_a_reduce_inside_a_reducer_drops_the_values_of_its_own_position() -> None:
    """A reducer that itself reduces (a scalar region's reduce names its own split of the
    operands): the values dropped after it are those its position frees, not another's."""
    text = """HloModule nested
inner {
  a = f32[] parameter(0)
  b = f32[] parameter(1)
  ROOT m = f32[] maximum(a, b)
}
outer {
  x = f32[] parameter(0)
  nx = f32[] negate(x)
  y = f32[] parameter(1)
  s = f32[] add(nx, y)
  z = f32[] constant(0)
  r = f32[] reduce(s, z), dimensions={}, to_apply=inner
  ROOT u = f32[] add(r, y)
}
ENTRY main {
  p = f32[4,8] parameter(0)
  c = f32[] constant(0)
  ROOT out = f32[4] reduce(p, c), dimensions={1}, to_apply=outer
}
"""
    x = np.arange(32, dtype=np.float32).reshape(4, 8) / 10 - 1
    (got,) = evaluate(parse_hlo_text(text), [x])
    expected = np.zeros(4, np.float32)
    for column in x.T:
        expected = np.maximum(column - expected, 0) + column
    np.testing.assert_allclose(got, expected, rtol=1e-6)


def test_slice_concatenate_transpose() -> None:
    x = np.arange(24, dtype=np.float32).reshape(4, 6)
    (s,) = run("x = f32[4,6] parameter(0)\nROOT s = f32[2,2] slice(x), slice={[1:4:2], [0:6:4]}", x)
    np.testing.assert_array_equal(s, x[1:4:2, 0:6:4])
    (c,) = run("x = f32[4,6] parameter(0)\nROOT c = f32[4,12] concatenate(x, x), dimensions={1}", x)
    np.testing.assert_array_equal(c, np.concatenate([x, x], axis=1))
    y = np.arange(24, dtype=np.float32).reshape(2, 3, 4)
    (t,) = run("y = f32[2,3,4] parameter(0)\nROOT t = f32[4,2,3] transpose(y), dimensions={2,0,1}", y)
    np.testing.assert_array_equal(t, y.transpose(2, 0, 1))


def test_broadcast_maps_operand_dimensions() -> None:
    x = np.arange(6, dtype=np.float32).reshape(2, 3)
    (b,) = run("x = f32[2,3] parameter(0)\nROOT b = f32[3,4,2] broadcast(x), dimensions={2,0}", x)
    assert b.shape == (3, 4, 2)
    for i in range(3):
        for j in range(4):
            np.testing.assert_array_equal(b[i, j, :], x[:, i])


def test_iota_and_reshape() -> None:
    i, f = run("i = s32[2,3] iota(), iota_dimension=1\nf = f32[3,2] iota(), iota_dimension=0\n"
               "r = f32[6] reshape(f)\nROOT t = (s32[2,3], f32[6]) tuple(i, r)")
    np.testing.assert_array_equal(i, [[0, 1, 2], [0, 1, 2]])
    assert i.dtype == np.int32
    np.testing.assert_array_equal(f, [0, 0, 1, 1, 2, 2])


@pytest.mark.parametrize(("direction", "op"), [
    ("EQ", np.equal), ("NE", np.not_equal), ("LT", np.less), ("LE", np.less_equal), ("GT", np.greater),
    ("GE", np.greater_equal),
])
def test_compare_and_select(direction: str, op) -> None:
    a = np.array([1, 2, 3, np.nan], dtype=np.float32)
    b = np.array([2, 2, 2, 2], dtype=np.float32)
    p, s = run("a = f32[4] parameter(0)\nb = f32[4] parameter(1)\n"
               f"p = pred[4] compare(a, b), direction={direction}\ns = f32[4] select(p, a, b)\n"
               "ROOT t = (pred[4], f32[4]) tuple(p, s)", a, b)
    np.testing.assert_array_equal(p, op(a, b))
    np.testing.assert_array_equal(s, np.where(op(a, b), a, b))


def test_convert() -> None:
    x = np.array([1.7, -1.7, np.nan, 3e9, -3e9, 0.0], dtype=np.float32)
    i, u, p = run("x = f32[6] parameter(0)\ni = s32[6] convert(x)\nu = u8[6] convert(x)\n"
                  "p = pred[6] convert(x)\nROOT t = (s32[6], u8[6], pred[6]) tuple(i, u, p)", x)
    np.testing.assert_array_equal(i, [1, -1, 0, 2**31 - 1, -(2**31), 0])
    np.testing.assert_array_equal(u, [1, 0, 0, 255, 0, 0])
    np.testing.assert_array_equal(p, [True, True, True, True, True, False])
    w = np.array([1.00390625, 1.01171875, -2.5, 1e-3], dtype=np.float32)
    (b,) = run("w = f32[4] parameter(0)\nROOT b = bf16[4] convert(w)", w)
    np.testing.assert_array_equal(b, np.array([1.0, 1.015625, -2.5, 131 / 128 * 2.0**-10], dtype=np.float32))
    n = np.array([-3, 300], dtype=np.int32)
    f, s8 = run("n = s32[2] parameter(0)\nf = f32[2] convert(n)\ns = s8[2] convert(n)\n"
                "ROOT t = (f32[2], s8[2]) tuple(f, s)", n)
    np.testing.assert_array_equal(f, [-3.0, 300.0])
    np.testing.assert_array_equal(s8, [-3, 44])  # wraps


def test_bf16_rounds_after_every_op() -> None:
    a = np.array([1.0, 256.0], dtype=np.float32)
    b = np.array([0.00390625, 1.0], dtype=np.float32)
    (s,) = run("a = bf16[2] parameter(0)\nb = bf16[2] parameter(1)\nROOT s = bf16[2] add(a, b)", a, b)
    np.testing.assert_array_equal(s, [1.0, 256.0])  # 1 + 2^-8 and 257 are not bf16 values: ties to even


def test_integer_arithmetic_follows_xla() -> None:
    a = np.array([-7, 7, 7, -2**31, 5], dtype=np.int32)
    b = np.array([2, -2, 0, -1, 3], dtype=np.int32)
    q, m = run("a = s32[5] parameter(0)\nb = s32[5] parameter(1)\nq = s32[5] divide(a, b)\n"
               "m = s32[5] multiply(a, a)\nROOT t = (s32[5], s32[5]) tuple(q, m)", a, b)
    np.testing.assert_array_equal(q, [-3, -3, -1, -2**31, 1])
    np.testing.assert_array_equal(m, (a.astype(np.int64) ** 2).astype(np.int32))


def test_unary_functions() -> None:
    x = np.array([0.25, 1.0, 4.0], dtype=np.float32)
    outs = run("x = f32[3] parameter(0)\na = f32[3] logistic(x)\nb = f32[3] rsqrt(x)\nc = f32[3] log(x)\n"
               "d = f32[3] sqrt(x)\ne = f32[3] negate(x)\nf = f32[3] tanh(x)\ng = f32[3] exponential(x)\n"
               "ROOT t = (f32[3], f32[3], f32[3], f32[3], f32[3], f32[3], f32[3]) "
               "tuple(a, b, c, d, e, f, g)", x)
    expected = [1 / (1 + np.exp(-x)), 1 / np.sqrt(x), np.log(x), np.sqrt(x), -x, np.tanh(x), np.exp(x)]
    for got, want in zip(outs, expected, strict=True):
        np.testing.assert_allclose(got, want, rtol=1e-6)


def test_dot_batch_dimensions_anywhere() -> None:
    rng = np.random.default_rng(0)
    a = rng.standard_normal((3, 2, 4), dtype=np.float32)  # [k, batch, m]
    b = rng.standard_normal((5, 3, 2), dtype=np.float32)  # [n, k, batch]
    (d,) = run("a = f32[3,2,4] parameter(0)\nb = f32[5,3,2] parameter(1)\n"
               "ROOT d = f32[2,4,5] dot(a, b), lhs_batch_dims={1}, lhs_contracting_dims={0}, "
               "rhs_batch_dims={2}, rhs_contracting_dims={1}", a, b)
    np.testing.assert_allclose(d, np.einsum("kbm,nkb->bmn", a, b), rtol=1e-5, atol=1e-6)


REGIONS = """
mul_r {
  a = f32[] parameter(0)
  b = f32[] parameter(1)
  ROOT m = f32[] multiply(b, a)
}
min_r {
  a = f32[] parameter(0)
  b = f32[] parameter(1)
  ROOT m = f32[] minimum(a, b)
}
sumsq_r {
  acc = f32[] parameter(0)
  x = f32[] parameter(1)
  sq = f32[] multiply(x, x)
  ROOT s = f32[] add(acc, sq)
}
argmax_r {
  v0 = f32[] parameter(0)
  i0 = s32[] parameter(1)
  v1 = f32[] parameter(2)
  i1 = s32[] parameter(3)
  gt = pred[] compare(v1, v0), direction=GT
  v = f32[] select(gt, v1, v0)
  i = s32[] select(gt, i1, i0)
  ROOT t = (f32[], s32[]) tuple(v, i)
}
"""


def test_reductions() -> None:
    x = np.arange(1, 25, dtype=np.float32).reshape(2, 3, 4) / 8
    prod, low, sumsq = run("x = f32[2,3,4] parameter(0)\none = f32[] constant(1)\nbig = f32[] constant(inf)\n"
                           "zero = f32[] constant(0)\n"
                           "p = f32[3] reduce(x, one), dimensions={0,2}, to_apply=mul_r\n"
                           "l = f32[2,4] reduce(x, big), dimensions={1}, to_apply=min_r\n"
                           "s = f32[2] reduce(x, zero), dimensions={1,2}, to_apply=sumsq_r\n"
                           "ROOT t = (f32[3], f32[2,4], f32[2]) tuple(p, l, s)", x, regions=REGIONS)
    np.testing.assert_allclose(prod, x.prod(axis=(0, 2)), rtol=1e-6)
    np.testing.assert_array_equal(low, x.min(axis=1))
    np.testing.assert_allclose(sumsq, (x * x).sum(axis=(1, 2)), rtol=1e-6)


def test_variadic_reduce_argmax() -> None:
    x = np.array([[1, 5, 2], [7, 0, 7]], dtype=np.float32)
    values, indices = run("x = f32[2,3] parameter(0)\ni = s32[2,3] iota(), iota_dimension=1\n"
                          "lo = f32[] constant(-inf)\nz = s32[] constant(0)\n"
                          "ROOT r = (f32[2], s32[2]) reduce(x, i, lo, z), dimensions={1}, to_apply=argmax_r",
                          x, regions=REGIONS)
    np.testing.assert_array_equal(values, [5, 7])
    np.testing.assert_array_equal(indices, [1, 0])


def test_call_tuple_and_get_tuple_element() -> None:
    regions = """
    pair {
      a = f32[2] parameter(0)
      b = f32[2] parameter(1)
      s = f32[2] add(a, b)
      d = f32[2] subtract(a, b)
      ROOT t = (f32[2], f32[2]) tuple(s, d)
    }
    """
    a = np.array([1, 2], dtype=np.float32)
    b = np.array([10, 20], dtype=np.float32)
    outs = run("a = f32[2] parameter(0)\nb = f32[2] parameter(1)\n"
               "c = (f32[2], f32[2]) call(a, b), to_apply=pair\nd = f32[2] get-tuple-element(c), index=1\n"
               "k = s32[2,2] constant({{1, 2}, {3, 4}})\n"
               "ROOT t = (f32[2], (f32[2], f32[2]), s32[2,2]) tuple(d, c, k)", a, b, regions=regions)
    np.testing.assert_array_equal(outs[0], a - b)
    np.testing.assert_array_equal(outs[1], a + b)
    np.testing.assert_array_equal(outs[2], a - b)
    np.testing.assert_array_equal(outs[3], [[1, 2], [3, 4]])


def test_make_inputs_is_seeded_and_typed(models_dir: Path) -> None:
    module = parse_hlo_text("ENTRY e {\n a = bf16[3,4] parameter(0)\n b = s32[5] parameter(1)\n"
                            " c = pred[2] parameter(2)\n"
                            " ROOT t = (bf16[3,4], s32[5], pred[2]) tuple(a, b, c)\n}")
    first, again, other = make_inputs(module, 3), make_inputs(module, 3), make_inputs(module, 4)
    assert [x.shape for x in first] == [(3, 4), (5,), (2,)]
    assert [x.dtype for x in first] == [np.float32, np.int32, np.bool_]
    for x, y in zip(first, again, strict=True):
        np.testing.assert_array_equal(x, y)
    assert not np.array_equal(first[0], other[0])
    words = first[0].view(np.uint32)
    assert np.all(words & 0xFFFF == 0)  # bf16 values


def test_input_mismatch_is_a_compile_error() -> None:
    module = parse_hlo_text("ENTRY e {\n ROOT a = f32[3] parameter(0)\n}")
    with pytest.raises(CompileError) as info:
        evaluate(module, [])
    assert info.value.code == "E104"
    with pytest.raises(CompileError) as info:
        evaluate(module, [np.zeros(4, np.float32)])
    assert info.value.code == "E104"


def read_set(path: Path) -> dict[str, common_pb2.Tensor]:
    tensor_set = common_pb2.TensorSet()
    tensor_set.ParseFromString(path.read_bytes())
    return {tensor.name: tensor for tensor in tensor_set.tensors}


def test_run_golden_seeded_and_given_inputs(models_dir: Path, tmp_path: Path) -> None:
    out = tmp_path / "golden.pb"
    run_golden(str(models_dir / "matmul_bf16.hlo.pb"), str(out), 7, None)
    tensors = read_set(out)
    assert list(tensors) == ["arg0", "arg1", "out0"]
    assert all(t.dtype == common_pb2.BF16 for t in tensors.values())
    assert list(tensors["out0"].shape) == [128, 384]

    args, expected = model_args(models_dir, "attention")
    given = common_pb2.TensorSet(
        tensors=[numpy_to_tensor(f"arg{i}", a, common_pb2.F32) for i, a in enumerate(args)])
    write_proto(tmp_path / "inputs.pb", given)
    run_golden(str(models_dir / "attention.hlo.pb"), str(out), 0, str(tmp_path / "inputs.pb"))
    tensors = read_set(out)
    got = storage_to_user_array(tensor_to_numpy(tensors["out0"]), tensors["out0"].dtype)
    np.testing.assert_allclose(got, expected, atol=1e-4)
    np.testing.assert_array_equal(tensor_to_numpy(tensors["arg2"]), args[2])

    wrong = common_pb2.TensorSet(tensors=[numpy_to_tensor("arg0", args[0][:4], common_pb2.F32)] * 3)
    write_proto(tmp_path / "wrong.pb", wrong)
    with pytest.raises(CompileError) as info:
        run_golden(str(models_dir / "attention.hlo.pb"), str(out), 0, str(tmp_path / "wrong.pb"))
    assert info.value.code == "E104"
    with pytest.raises(CompileError) as info:
        run_golden(str(tmp_path / "missing.hlo.pb"), str(out), 0, None)
    assert info.value.code == "E101"
