"""What reduce-precision and the three batch-norm ops compute, in numpy: the golden evaluator's
definition of them, written from XLA's semantics independently of the frontend, which expands the
same ops into elementwise HLO (tools/hlo2penguin/expand.py) and is checked against this.

Values are float32 arrays, as the evaluator holds every float type; the caller rounds results to
the op's type. The batch norms follow XLA's BatchNormExpander formulas in float32, so a compile
and its golden run agree on the variance's cancellation too: the training variance is
E[x²] - E[x]², as XLA computes it.
"""

from __future__ import annotations

import numpy as np

F32_MANTISSA_BITS, F32_EXPONENT_BITS = 23, 8
F32_EXPONENT_MASK, F32_SIGN_MASK = 0x7F800000, 0x80000000


def reduce_precision(x: np.ndarray, exponent_bits: int, mantissa_bits: int) -> np.ndarray:
    """x rounded to a float of `exponent_bits` and `mantissa_bits` (round to nearest even), held as
    float32: past the smaller exponent's range a value becomes ±inf, at or below its smallest normal
    exponent ±0 (no denormals); NaN stays NaN."""
    x = np.asarray(x, dtype=np.float32)
    bits = x.view(np.uint32).astype(np.uint64)  # room for the rounding carry; wrapped below
    if mantissa_bits < F32_MANTISSA_BITS:
        dropped = F32_MANTISSA_BITS - mantissa_bits
        last_kept = (bits >> dropped) & 1
        bits = (bits + last_kept + ((1 << (dropped - 1)) - 1)) & ~np.uint64((1 << dropped) - 1)
        bits &= 0xFFFFFFFF
    if exponent_bits < F32_EXPONENT_BITS:
        bias, reduced_bias = 127, (1 << (exponent_bits - 1)) - 1
        exponent = bits & F32_EXPONENT_MASK
        sign = bits & F32_SIGN_MASK
        overflows = exponent > ((bias + reduced_bias) << F32_MANTISSA_BITS)
        underflows = exponent <= ((bias - reduced_bias) << F32_MANTISSA_BITS)
        bits = np.where(overflows, sign | F32_EXPONENT_MASK, np.where(underflows, sign, bits))
    rounded = bits.astype(np.uint32).view(np.float32)
    return np.where(np.isnan(x), x, rounded)


def _feature_axes(x: np.ndarray, feature_index: int) -> tuple[tuple[int, ...], list[int], int]:
    """(the axes reduced, the shape a feature vector broadcasts as, elements per feature)."""
    axes = tuple(d for d in range(x.ndim) if d != feature_index)
    shape = [1] * x.ndim
    shape[feature_index] = x.shape[feature_index]
    count = int(np.prod([x.shape[d] for d in axes], dtype=np.int64))
    return axes, shape, count


def _f32(*arrays: np.ndarray) -> list[np.ndarray]:
    return [np.asarray(a, dtype=np.float32) for a in arrays]


def batch_norm_inference(x, scale, offset, mean, variance, epsilon: float, feature_index: int) -> np.ndarray:
    x, scale, offset, mean, variance = _f32(x, scale, offset, mean, variance)
    _, shape, _ = _feature_axes(x, feature_index)
    true_scale = scale * (np.float32(1) / np.sqrt(variance + np.float32(epsilon)))
    true_shift = offset - mean * true_scale
    return x * true_scale.reshape(shape) + true_shift.reshape(shape)


def batch_norm_training(x, scale, offset, epsilon: float, feature_index: int) -> tuple[np.ndarray, ...]:
    """(normalized, batch mean, batch variance)."""
    x, scale, offset = _f32(x, scale, offset)
    axes, shape, count = _feature_axes(x, feature_index)
    n = np.float32(count)
    mean = np.sum(x, axis=axes, dtype=np.float32) / n
    variance = np.sum(x * x, axis=axes, dtype=np.float32) / n - mean * mean
    inverse = np.float32(1) / np.sqrt(variance + np.float32(epsilon))
    y = (x - mean.reshape(shape)) * inverse.reshape(shape) * scale.reshape(shape) + offset.reshape(shape)
    return y, mean, variance


def batch_norm_grad(x, scale, mean, variance, grad_y, epsilon: float,
                    feature_index: int) -> tuple[np.ndarray, ...]:
    """(grad of x, grad of scale, grad of offset)."""
    x, scale, mean, variance, grad_y = _f32(x, scale, mean, variance, grad_y)
    axes, shape, count = _feature_axes(x, feature_index)
    n = np.float32(count)
    eps = np.float32(epsilon)
    centered = x - mean.reshape(shape)
    grad_offset = np.sum(grad_y, axis=axes, dtype=np.float32)
    projected = np.sum(grad_y * centered, axis=axes, dtype=np.float32)
    inverse = np.float32(1) / np.sqrt(variance + eps)
    grad_scale = projected * inverse
    inner = grad_y * n - grad_offset.reshape(shape) - centered * projected.reshape(shape) / (
        variance.reshape(shape) + eps)
    grad_x = (scale * inverse).reshape(shape) / n * inner
    return grad_x, grad_scale, grad_offset
