"""Regenerate tests/data/loops/: small JAX loops (lax.scan, fori_loop) as HLO text, for the tests of
while loops kept as loops (tests/test_repeat.py), which compile each kept and unrolled and compare.

Needs JAX (an optional extra; the .hlo files are committed). Usage: python scripts/make_loop_fixtures.py
"""

from __future__ import annotations

from pathlib import Path

OUT = Path(__file__).resolve().parents[1] / "tests" / "data" / "loops"


def fixtures() -> dict:
    """name -> (function, argument shapes): each a loop shape the region code must get right."""
    import jax
    import jax.numpy as jnp
    from jax import lax

    def rnn_reverse(xs, h0, w):  # a scan backwards: xs[t] and ys[t] move by a negative step
        def step(h, x):
            h = jnp.tanh(x @ w + h)
            return h, h * 2.0
        return lax.scan(step, h0, xs, reverse=True)

    def layer_scan(x, ws, bs):  # a scan over stacked layer weights: each trip reads its layer's
        def layer(h, wb):
            w, b = wb
            return jax.nn.gelu(h @ w + b), None
        return lax.scan(layer, x, (ws, bs))[0]

    def fori_decay(x):  # fori_loop: the carry only, no xs or ys
        return lax.fori_loop(0, 50, lambda i, c: c * 0.9 + jnp.sin(c), x)

    def counter_data(x):  # the counter used as data
        return lax.fori_loop(0, 12, lambda i, c: c + i.astype(jnp.float32), x)

    def running_stats(xs):  # two carries, four results
        def step(c, x):
            s, m = c
            s, m = s + x, jnp.maximum(m, x)
            return (s, m), (s, m)
        init = (jnp.zeros(xs.shape[1:]), jnp.full(xs.shape[1:], -jnp.inf))
        return lax.scan(step, init, xs)

    def swap_carry(a, b):  # carries that trade places every trip
        return lax.fori_loop(0, 9, lambda i, c: (c[1] * 1.5, c[0] + 1.0), (a, b))

    def nested_scan(xs, w):  # a scan inside a scan's body
        def outer(h, row):
            h2 = lax.scan(lambda h, x: (jnp.tanh(h + x), None), h, row)[0]
            return h2 @ w, h2
        return lax.scan(outer, jnp.zeros((8, 16)), xs)

    def euler(y0, a):  # ys of a slice of the carry, no xs (length=)
        def step(y, _):
            y = y + 0.01 * jnp.tanh(y @ a)
            return y, y[:, :4]
        return lax.scan(step, y0, None, length=300)

    def decoder_scan(x, stack):  # a transformer layer scanned over stacked weights (Flax's nn.scan)
        def layer(x, p):
            h = x * lax.rsqrt(jnp.mean(x * x, axis=-1, keepdims=True) + 1e-6)
            q, k, v = ((h @ p[w]).reshape(256, 8, 64).transpose(1, 0, 2) for w in ("wq", "wk", "wv"))
            attention = jax.nn.softmax(jnp.einsum("hqd,hkd->hqk", q, k) / 8.0, axis=-1)
            x = x + jnp.einsum("hqk,hkd->hqd", attention, v).transpose(1, 0, 2).reshape(256, 512) @ p["wo"]
            h = x * lax.rsqrt(jnp.mean(x * x, axis=-1, keepdims=True) + 1e-6)
            return x + (jax.nn.silu(h @ p["w1"]) * (h @ p["w3"])) @ p["w2"], None
        return lax.scan(layer, x, stack)[0]

    def vector_state(x, w):  # a 1-D state: h[16] @ w is a vector-matrix product every trip
        def step(h, xt):
            h = 0.5 * h + 0.3 * jnp.tanh(h @ w * 0.1 + xt)
            return h, h[None, :3]
        return lax.scan(step, jnp.zeros((16,)), x.T)

    def greedy_decode(emb, wout):  # each trip looks up the row the last trip's argmax chose
        def step(c, _):
            token, h = c
            h = jnp.tanh(h * 0.5 + lax.dynamic_index_in_dim(emb, token, keepdims=False))
            logits = h @ wout
            token = jnp.argmax(logits).astype(jnp.int32)
            return (token, h), (token, jnp.max(logits))
        return lax.scan(step, (jnp.int32(3), jnp.zeros((32,))), None, length=20)

    square, wide, narrow = (4, 512, 512), (4, 512, 1024), (4, 1024, 512)
    decoder_weights = {"w1": wide, "w2": narrow, "w3": wide, "wk": square, "wo": square, "wq": square,
                       "wv": square}

    return {
        "decoder_scan": (decoder_scan, [(256, 512), decoder_weights]),
        "rnn_reverse": (rnn_reverse, [(64, 8, 16), (8, 16), (16, 16)]),
        "layer_scan": (layer_scan, [(128, 256), (12, 256, 256), (12, 256)]),
        "fori_decay": (fori_decay, [(130, 70)]),
        "counter_data": (counter_data, [(16, 16)]),
        "running_stats": (running_stats, [(40, 6, 10)]),
        "swap_carry": (swap_carry, [(5, 7), (5, 7)]),
        "nested_scan": (nested_scan, [(6, 5, 8, 16), (16, 16)]),
        "euler": (euler, [(16, 64), (64, 64)]),
        "vector_state": (vector_state, [(16, 60), (16, 16)]),
        "greedy_decode": (greedy_decode, [(40, 32), (32, 40)]),
    }


def main() -> None:
    import jax
    import jax.numpy as jnp

    OUT.mkdir(parents=True, exist_ok=True)
    for name, (function, shapes) in fixtures().items():
        args = jax.tree_util.tree_map(lambda shape: jax.ShapeDtypeStruct(shape, jnp.float32), shapes,
                                      is_leaf=lambda leaf: isinstance(leaf, tuple))
        text = jax.jit(function).lower(*args).compiler_ir("hlo").as_hlo_text()
        (OUT / f"{name}.hlo").write_text(text)
        print(name, shapes)


if __name__ == "__main__":
    main()
