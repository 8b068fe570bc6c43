"""Generated HLO modules of any size: the scale benchmark's and the scale tests' inputs.

Each family is written twice, as HLO text (what ncc compiles; needs nothing) and as the same
function in JAX (what XLA:CPU compiles when JAX is installed, so the benchmark can time both
compilers on one function in one run):

  chain      N elementwise ops on f32[R, C]: x -> x*c+x -> tanh -> ... (a long straight line)
  mlp        L layers of gelu(x @ W_l) on x f32[B, D], W_l f32[D, D] (weights are parameters)
  attention  L stacked single-head attention blocks with a residual, on x f32[S, D]
  bdot       a batched dot f32[B, M, K] x f32[B, K, N]
  fan        N elementwise ops on f32[R, C] where step i also reads step i // 2: about N / 2 values
             are live at once in every tile, more than SBUF holds for N = 100, C = 8192
  scan       a tanh RNN `lax.scan` over T steps of f32[B, H]: one while loop (kept as a loop from
             the Frontend on when unrolling it would cost 20,000 instructions or more)

`hlo_text(family, **size)` returns the module text; `jax_function(family, **size)` returns
(function, argument shapes) or None without JAX.
"""

from __future__ import annotations

from collections.abc import Callable

ADD = """
add {
  a = f32[] parameter(0)
  b = f32[] parameter(1)
  ROOT s = f32[] add(a, b)
}
"""
MAX = """
max {
  a = f32[] parameter(0)
  b = f32[] parameter(1)
  ROOT m = f32[] maximum(a, b)
}
"""


def chain(n: int, rows: int = 512, cols: int = 1024) -> str:
    """N elementwise ops; every third is a tanh so values stay bounded."""
    shape = f"f32[{rows},{cols}]"
    lines = [
        f"  x0 = {shape} parameter(0)",
        "  c = f32[] constant(0.5)",
        f"  cb = {shape} broadcast(c), dimensions={{}}",
    ]
    for i in range(1, n + 1):
        prev = f"x{i - 1}"
        if i % 3 == 0:
            body = f"tanh({prev})"
        elif i % 3 == 1:
            body = f"multiply({prev}, cb)"
        else:
            body = f"add({prev}, x{max(0, i - 2)})"
        root = "ROOT " if i == n else ""
        lines.append(f"  {root}x{i} = {shape} {body}")
    return f"HloModule chain_{n}\n\nENTRY main {{\n" + "\n".join(lines) + "\n}\n"


def _gelu_lines(name: str, shape: str, source: str) -> list[str]:
    return [
        f"  {name}.c0 = f32[] constant(0.044715)",
        f"  {name}.c1 = f32[] constant(0.797884583)",
        f"  {name}.c2 = f32[] constant(1)",
        f"  {name}.c3 = f32[] constant(0.5)",
        f"  {name}.b0 = {shape} broadcast({name}.c0), dimensions={{}}",
        f"  {name}.b1 = {shape} broadcast({name}.c1), dimensions={{}}",
        f"  {name}.b2 = {shape} broadcast({name}.c2), dimensions={{}}",
        f"  {name}.b3 = {shape} broadcast({name}.c3), dimensions={{}}",
        f"  {name}.sq = {shape} multiply({source}, {source})",
        f"  {name}.cu = {shape} multiply({name}.sq, {source})",
        f"  {name}.m0 = {shape} multiply({name}.cu, {name}.b0)",
        f"  {name}.a0 = {shape} add({source}, {name}.m0)",
        f"  {name}.m1 = {shape} multiply({name}.a0, {name}.b1)",
        f"  {name}.t = {shape} tanh({name}.m1)",
        f"  {name}.a1 = {shape} add({name}.t, {name}.b2)",
        f"  {name}.m2 = {shape} multiply({name}.a1, {name}.b3)",
        f"  {name} = {shape} multiply({source}, {name}.m2)",
    ]


def mlp(batch: int, d: int, layers: int = 2) -> str:
    """gelu(x @ W_1) ... @ W_L: every layer a [B,D]x[D,D] dot and a gelu."""
    shape = f"f32[{batch},{d}]"
    lines = [f"  x = {shape} parameter(0)"]
    lines += [f"  w{i} = f32[{d},{d}] parameter({i + 1})" for i in range(layers)]
    source = "x"
    for i in range(layers):
        lines.append(
            f"  h{i} = {shape} dot({source}, w{i}), lhs_contracting_dims={{1}}, rhs_contracting_dims={{0}}"
        )
        lines += _gelu_lines(f"g{i}", shape, f"h{i}")
        source = f"g{i}"
    lines.append(f"  ROOT out = {shape} add({source}, x)")
    return f"HloModule mlp_{batch}x{d}x{layers}\n\nENTRY main {{\n" + "\n".join(lines) + "\n}\n"


def attention(seq: int, d: int, layers: int = 1) -> str:
    """L blocks of x + softmax(x Wq (x Wk)^T / sqrt(d)) x Wv, one head."""
    shape, scores = f"f32[{seq},{d}]", f"f32[{seq},{seq}]"
    lines = [f"  x0 = {shape} parameter(0)"]
    for name, number in (("wq", 1), ("wk", 2), ("wv", 3)):
        lines.append(f"  {name} = f32[{d},{d}] parameter({number})")
    dims = "lhs_contracting_dims={1}, rhs_contracting_dims={0}"
    for i in range(layers):
        x, nxt = f"x{i}", f"x{i + 1}"
        p = f"l{i}"
        lines += [
            f"  {p}.q = {shape} dot({x}, wq), {dims}",
            f"  {p}.k = {shape} dot({x}, wk), {dims}",
            f"  {p}.v = {shape} dot({x}, wv), {dims}",
            f"  {p}.s = {scores} dot({p}.q, {p}.k), lhs_contracting_dims={{1}}, rhs_contracting_dims={{1}}",
            f"  {p}.scale = f32[] constant({1.0 / d**0.5:.6f})",
            f"  {p}.scaleb = {scores} broadcast({p}.scale), dimensions={{}}",
            f"  {p}.ss = {scores} multiply({p}.s, {p}.scaleb)",
            f"  {p}.ninf = f32[] constant(-inf)",
            f"  {p}.max = f32[{seq}] reduce({p}.ss, {p}.ninf), dimensions={{1}}, to_apply=max",
            f"  {p}.maxb = {scores} broadcast({p}.max), dimensions={{0}}",
            f"  {p}.sub = {scores} subtract({p}.ss, {p}.maxb)",
            f"  {p}.exp = {scores} exponential({p}.sub)",
            f"  {p}.zero = f32[] constant(0)",
            f"  {p}.sum = f32[{seq}] reduce({p}.exp, {p}.zero), dimensions={{1}}, to_apply=add",
            f"  {p}.sumb = {scores} broadcast({p}.sum), dimensions={{0}}",
            f"  {p}.p = {scores} divide({p}.exp, {p}.sumb)",
            f"  {p}.o = {shape} dot({p}.p, {p}.v), {dims}",
            f"  {nxt} = {shape} add({x}, {p}.o)",
        ]
    lines[-1] = "  ROOT" + lines[-1][1:]
    body = "\n".join(lines)
    return f"HloModule attention_{seq}x{d}x{layers}\n{ADD}{MAX}\nENTRY main {{\n{body}\n}}\n"


def bdot(batch: int, m: int, k: int, n: int) -> str:
    """One batched dot [B,M,K] x [B,K,N] -> [B,M,N]."""
    return (
        f"HloModule bdot_{batch}x{m}x{k}x{n}\n\nENTRY main {{\n"
        f"  a = f32[{batch},{m},{k}] parameter(0)\n"
        f"  b = f32[{batch},{k},{n}] parameter(1)\n"
        f"  ROOT d = f32[{batch},{m},{n}] dot(a, b), lhs_batch_dims={{0}}, lhs_contracting_dims={{2}}, "
        "rhs_batch_dims={0}, rhs_contracting_dims={1}\n}\n"
    )


def fan(n: int, rows: int = 128, cols: int = 8192) -> str:
    """x_i = x_{i-1} (tanh'd every third step) + or * x_{i // 2}."""
    shape = f"f32[{rows},{cols}]"
    lines = [f"HloModule fan_{n}x{rows}x{cols}", "", "ENTRY main {", f"  x0 = {shape} parameter(0)"]
    for i in range(1, n + 1):
        previous = f"x{i - 1}"
        if i % 3 == 0:
            lines.append(f"  t{i} = {shape} tanh({previous})")
            previous = f"t{i}"
        op = "add" if i % 2 else "multiply"
        lines.append(f"  {'ROOT ' if i == n else ''}x{i} = {shape} {op}({previous}, x{i // 2})")
    return "\n".join([*lines, "}", ""])


def scan(steps: int, batch: int = 4, hidden: int = 32) -> str:
    """`lax.scan` of a tanh RNN over `steps`: one HLO while loop that reads xs[t] and writes ys[t]."""
    state = f"(s32[], f32[{batch},{hidden}], f32[{steps},{batch},{hidden}], f32[{steps},{batch},{hidden}], " \
            f"f32[{hidden},{hidden}], f32[{hidden},{hidden}])"
    h, seq, row = f"f32[{batch},{hidden}]", f"f32[{steps},{batch},{hidden}]", f"f32[1,{batch},{hidden}]"
    names = ("i", "h", "ys", "xs", "w", "u")
    unpack = [f"  {name} = {kind} get-tuple-element(p), index={k}"
              for k, (name, kind) in enumerate(zip(names, ("s32[]", h, seq, seq, f"f32[{hidden},{hidden}]",
                                                           f"f32[{hidden},{hidden}]"), strict=True))]
    dot = "lhs_contracting_dims={1}, rhs_contracting_dims={0}"
    return "\n".join([
        f"HloModule scan_{steps}", "", "body {", f"  p = {state} parameter(0)", *unpack,
        "  zero = s32[] constant(0)",
        f"  x3 = {row} dynamic-slice(xs, i, zero, zero), dynamic_slice_sizes={{1,{batch},{hidden}}}",
        f"  x = {h} reshape(x3)", f"  xw = {h} dot(x, w), {dot}", f"  hu = {h} dot(h, u), {dot}",
        f"  s = {h} add(xw, hu)", f"  hn = {h} tanh(s)", f"  hn3 = {row} reshape(hn)",
        f"  ysn = {seq} dynamic-update-slice(ys, hn3, i, zero, zero)",
        "  one = s32[] constant(1)", "  inext = s32[] add(i, one)",
        f"  ROOT r = {state} tuple(inext, hn, ysn, xs, w, u)", "}", "",
        "cond {", f"  p = {state} parameter(0)", "  i = s32[] get-tuple-element(p), index=0",
        f"  n = s32[] constant({steps})", "  ROOT lt = pred[] compare(i, n), direction=LT", "}", "",
        "ENTRY main {", f"  xs = {seq} parameter(0)", f"  h0 = {h} parameter(1)",
        f"  w = f32[{hidden},{hidden}] parameter(2)", f"  u = f32[{hidden},{hidden}] parameter(3)",
        "  zero = s32[] constant(0)", "  z = f32[] constant(0)",
        f"  ys0 = {seq} broadcast(z), dimensions={{}}",
        f"  init = {state} tuple(zero, h0, ys0, xs, w, u)",
        f"  loop = {state} while(init), condition=cond, body=body",
        f"  hT = {h} get-tuple-element(loop), index=1", f"  ys = {seq} get-tuple-element(loop), index=2",
        f"  ROOT out = ({h}, {seq}) tuple(hT, ys)", "}", ""])


FAMILIES: dict[str, Callable[..., str]] = {"chain": chain, "mlp": mlp, "attention": attention, "bdot": bdot,
                                           "fan": fan, "scan": scan}


def hlo_text(family: str, **size: int) -> str:
    return FAMILIES[family](**size)


def jax_function(family: str, **size: int) -> tuple[Callable, list[tuple[int, ...]]] | None:
    """The same function in JAX and its argument shapes, or None when JAX is not installed."""
    try:
        import jax.numpy as jnp
    except ImportError:
        return None

    def gelu(h):
        return 0.5 * h * (1 + jnp.tanh(0.797884583 * (h + 0.044715 * h * h * h)))

    if family == "chain":
        n, rows, cols = size["n"], size.get("rows", 512), size.get("cols", 1024)

        def f_chain(x0):
            xs = [x0]
            for i in range(1, n + 1):
                prev = xs[-1]
                if i % 3 == 0:
                    xs.append(jnp.tanh(prev))
                elif i % 3 == 1:
                    xs.append(prev * 0.5)
                else:
                    xs.append(prev + xs[max(0, i - 2)])
            return xs[-1]

        return f_chain, [(rows, cols)]
    if family == "mlp":
        batch, d, layers = size["batch"], size["d"], size.get("layers", 2)

        def f_mlp(x, *ws):
            h = x
            for w in ws:
                h = gelu(h @ w)
            return h + x

        return f_mlp, [(batch, d)] + [(d, d)] * layers
    if family == "attention":
        seq, d, layers = size["seq"], size["d"], size.get("layers", 1)

        def f_attention(x, wq, wk, wv):
            import jax

            for _ in range(layers):
                s = (x @ wq) @ (x @ wk).T * (1.0 / d**0.5)
                x = x + jax.nn.softmax(s, axis=-1) @ (x @ wv)
            return x

        return f_attention, [(seq, d), (d, d), (d, d), (d, d)]
    if family == "fan":
        n, rows, cols = size["n"], size.get("rows", 128), size.get("cols", 8192)

        def f_fan(x0):
            xs = [x0]
            for i in range(1, n + 1):
                previous = jnp.tanh(xs[-1]) if i % 3 == 0 else xs[-1]
                xs.append(previous + xs[i // 2] if i % 2 else previous * xs[i // 2])
            return xs[-1]

        return f_fan, [(rows, cols)]
    if family == "scan":
        steps, batch, hidden = size["steps"], size.get("batch", 4), size.get("hidden", 32)

        def f_scan(xs, h0, w, u):
            from jax import lax

            def step(h, x):
                h = jnp.tanh(x @ w + h @ u)
                return h, h

            return lax.scan(step, h0, xs)

        return f_scan, [(steps, batch, hidden), (batch, hidden), (hidden, hidden), (hidden, hidden)]
    if family == "bdot":
        batch, m, k, n = size["batch"], size["m"], size["k"], size["n"]
        return (lambda a, b: jnp.einsum("bmk,bkn->bmn", a, b)), [(batch, m, k), (batch, k, n)]
    raise KeyError(family)
