"""rng-bit-generator's bits as XLA:CPU computes them, in numpy: the golden evaluator's definition.

XLA does not run rng-bit-generator as one kernel: its RngBitGeneratorExpander rewrites it into
plain integer HLO (xla/hlo/builder/lib/prng.cc), and CPU maps RNG_DEFAULT to Philox. The bits are
therefore fixed by that expansion, which this module restates; the lowering (hlo2penguin/random.py)
builds the same arithmetic from device ops. The state operand is u64[n]: state[0] is the key.

- Threefry-2x32 (20 rounds) over a 64-bit counter, state = (key, counter). A 64-bit output uses
  one counter per element (counter + row-major index; the bits are word 0 | word 1 << 32). A
  32-bit output (and a narrower one: 32 bits truncated) takes both words of each counter, so it
  needs half as many counters: one dimension (the first even one, else the first largest) is
  halved; element j of it is word j % 2 of counter j // 2 of the halved shape. A scalar is word 0
  of counter 0. The new counter is counter + the number of counters used.
- Philox-4x32 (10 rounds) over a 128-bit counter: with a u64[2] state, its low half is state[1]
  and its high half the key (XLA reverses the state), and only the low half is written back; with
  u64[3], the counter is (state[1], state[2]). Counter i gives 4 words: a 32-bit output takes them
  in order (element 4i + w is word w), a 64-bit one in pairs (element 2i + p is word 2p |
  word 2p + 1 << 32). The new counter is counter + the number of counters used (128-bit add).
"""

from __future__ import annotations

import numpy as np

RNG_DEFAULT, RNG_THREE_FRY, RNG_PHILOX = 0, 1, 2
ALGORITHM_NAMES = {RNG_DEFAULT: "rng_default", RNG_THREE_FRY: "rng_three_fry", RNG_PHILOX: "rng_philox"}
CPU_DEFAULT = RNG_PHILOX  # what XLA:CPU runs for RNG_DEFAULT

THREEFRY_ROTATIONS = ((13, 15, 26, 6), (17, 29, 16, 24))
THREEFRY_PARITY = 0x1BD11BDA
PHILOX_ROUNDS = 10
PHILOX_MULTIPLIERS = (0xD2511F53, 0xCD9E8D57)  # for words 0 and 2
PHILOX_KEY_STEPS = (0x9E3779B9, 0xBB67AE85)
MASK32 = 0xFFFFFFFF

_U32, _U64 = np.uint32, np.uint64


def resolve(algorithm: int) -> int:
    """The algorithm XLA:CPU runs for `algorithm`."""
    return CPU_DEFAULT if algorithm == RNG_DEFAULT else algorithm


def state_sizes(algorithm: int) -> tuple[int, ...]:
    """The u64 state lengths XLA:CPU takes for `algorithm`."""
    return (2, 3) if resolve(algorithm) == RNG_PHILOX else (2,)


def split_dimension(shape: tuple[int, ...]) -> int:
    """The dimension Threefry's 32-bit output halves: the first even one, else the first largest."""
    for d, extent in enumerate(shape):
        if extent % 2 == 0:
            return d
    return max(range(len(shape)), key=lambda d: (shape[d], -d))


def threefry_counters(shape: tuple[int, ...], width: int) -> int:
    """How many 64-bit counters Threefry uses for an output of `shape` with `width`-byte elements."""
    if width == 8:
        return int(np.prod(shape, dtype=np.int64))
    if not shape:
        return 1
    d = split_dimension(shape)
    halved = shape[:d] + ((shape[d] + 1) // 2,) + shape[d + 1:]
    return int(np.prod(halved, dtype=np.int64))


def philox_counters(count: int, width: int) -> int:
    """How many 128-bit counters Philox uses for `count` elements of `width` bytes (4 words each)."""
    words = count * (2 if width == 8 else 1)
    return -(-words // 4)


def threefry2x32(x0: np.ndarray, x1: np.ndarray, k0: int, k1: int) -> tuple[np.ndarray, np.ndarray]:
    """Threefry-2x32, 20 rounds, on uint32 arrays; the key is two 32-bit ints."""
    ks = (_U32(k0), _U32(k1), _U32(k0 ^ k1 ^ THREEFRY_PARITY))
    x0, x1 = x0.astype(_U32) + ks[0], x1.astype(_U32) + ks[1]
    for block in range(5):
        for rotation in THREEFRY_ROTATIONS[block % 2]:
            x0 = x0 + x1
            x1 = (x1 << _U32(rotation)) | (x1 >> _U32(32 - rotation))
            x1 = x0 ^ x1
        x0 = x0 + ks[(block + 1) % 3]
        x1 = x1 + ks[(block + 2) % 3] + _U32(block + 1)
    return x0, x1


def philox4x32(words: list[np.ndarray], k0: int, k1: int) -> list[np.ndarray]:
    """Philox-4x32, 10 rounds, on four uint32 arrays; the key is two 32-bit ints."""
    x = [w.astype(_U32) for w in words]
    key = [k0, k1]
    for _ in range(PHILOX_ROUNDS):
        p0 = x[0].astype(_U64) * _U64(PHILOX_MULTIPLIERS[0])
        p1 = x[2].astype(_U64) * _U64(PHILOX_MULTIPLIERS[1])
        hi0, lo0 = (p0 >> _U64(32)).astype(_U32), p0.astype(_U32)
        hi1, lo1 = (p1 >> _U64(32)).astype(_U32), p1.astype(_U32)
        x = [hi1 ^ x[1] ^ _U32(key[0]), lo1, hi0 ^ x[3] ^ _U32(key[1]), lo0]
        key = [(k + step) & MASK32 for k, step in zip(key, PHILOX_KEY_STEPS, strict=True)]
    return x


def _halves(value: int) -> tuple[int, int]:
    return value & MASK32, value >> 32


def _threefry(key: int, counter: int, shape: tuple[int, ...], width: int) -> tuple[np.ndarray, int]:
    """(u32 or u64 bits of `shape`, the new counter)."""
    used = threefry_counters(shape, width)
    counters = np.arange(used, dtype=_U64) + _U64(counter)
    lo, hi = threefry2x32(counters.astype(_U32), (counters >> _U64(32)).astype(_U32), *_halves(key))
    new_counter = (counter + used) & (2**64 - 1)
    if width == 8:
        return (lo.astype(_U64) | (hi.astype(_U64) << _U64(32))).reshape(shape), new_counter
    if not shape:
        return lo.reshape(()), new_counter
    d = split_dimension(shape)
    halved = shape[:d] + ((shape[d] + 1) // 2, 1) + shape[d + 1:]
    pairs = np.concatenate([lo.reshape(halved), hi.reshape(halved)], axis=d + 1)
    even = shape[:d] + (2 * halved[d],) + shape[d + 1:]
    bits = pairs.reshape(even)[tuple(slice(0, n) for n in shape)]
    return bits, new_counter


def _philox(key: int, low: int, high: int, shape: tuple[int, ...], width: int) -> tuple[np.ndarray, int, int]:
    """(u32 or u64 bits of `shape`, the new 128-bit counter as (low, high))."""
    count = int(np.prod(shape, dtype=np.int64))
    used = philox_counters(count, width)
    lows = np.arange(used, dtype=_U64) + _U64(low)
    highs = np.full(used, high, dtype=_U64) + (lows < _U64(low)).astype(_U64)
    words = [lows.astype(_U32), (lows >> _U64(32)).astype(_U32), highs.astype(_U32),
             (highs >> _U64(32)).astype(_U32)]
    out = philox4x32(words, *_halves(key))
    if width == 8:
        pairs = [out[2 * p].astype(_U64) | (out[2 * p + 1].astype(_U64) << _U64(32)) for p in range(2)]
        flat = np.stack(pairs, axis=1).reshape(-1)
    else:
        flat = np.stack(out, axis=1).reshape(-1)
    total = low + (high << 64) + used
    return flat[:count].reshape(shape), total & (2**64 - 1), (total >> 64) & (2**64 - 1)


def rng_bit_generator(state: np.ndarray, shape: tuple[int, ...], dtype: np.dtype,
                      algorithm: int) -> tuple[np.ndarray, np.ndarray]:
    """(new state, bits): XLA:CPU's rng-bit-generator of a u64[2] (or, for Philox, u64[3]) state.

    `dtype` is any 8/16/32/64-bit integer numpy dtype: the bits are returned as that type (the same
    bits; narrow types keep the low bits of a 32-bit draw)."""
    state = np.asarray(state, dtype=_U64).reshape(-1)
    shape = tuple(int(d) for d in shape)
    dtype = np.dtype(dtype)
    width = 8 if dtype.itemsize == 8 else 4
    words = [int(v) for v in state]
    key = words[0]
    if resolve(algorithm) == RNG_THREE_FRY:
        bits, counter = _threefry(key, words[1], shape, width)
        new_state = [key, counter]
    else:
        high = words[2] if len(words) >= 3 else key
        bits, low, high = _philox(key, words[1], high, shape, width)
        new_state = [key, low, high] if len(words) >= 3 else [key, low]
    unsigned = np.dtype(f"u{dtype.itemsize}")
    bits = bits.astype(unsigned).view(dtype)  # narrowing keeps the low bits, as XLA's convert does
    return np.asarray(new_state, dtype=_U64), bits
