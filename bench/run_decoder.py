"""A LLaMA-style decoder of 7B shape through ncc (`make bench-decoder`; needs the optional JAX extra).

The model, written here in plain JAX: L layers of d_model D, 32 heads, RMSNorm, RoPE, causal
softmax attention (scores in f32), SwiGLU feed-forward of width F, bf16 activations and weights,
sequence S. For each layer count asked (default 1 and 32 at S = 2048, D = 4096, F = 11008, the 7B
widths), the bench writes the module's HLO (`jax.jit(model).lower(...)`), compiles it once with
`ncc compile` (default `--loops auto`, which rolls a program this size) and prints

  compile      end-to-end wall of `ncc compile`, and each job's wall
  peak RSS     the largest peak of any job's process (each job is its own process)
  NEFF / executed
               entries of the per-engine streams, and the instructions they execute, loops expanded
  XLA:CPU      `jax.jit(model).lower(...).compile()` of the same function, timed in this run

With --run (default for one layer), seeded inputs go through `ncc run` (the simulator: outputs,
simulated time, races, deadlock) and the output is compared with JAX's on the same inputs, in bf16
as JAX computes it and in f32 (every input widened): ncc matches when its relative L2 error
against f32 is at most TOLERANCE times bf16 JAX's own (the two differ only by rounding order).

With --scan the layers are one `lax.scan` over stacked weights (Flax's nn.scan), an HLO while loop
that the first job keeps as a loop (a Repeat region): the compile then costs about one layer.

    python bench/run_decoder.py [--layers 1,32] [--seq 2048] [--d 4096] [--ffn 11008] [--heads 32]
                                [--timeout 900] [--keep DIR] [--no-run] [--scan]
"""

from __future__ import annotations

import argparse
import contextlib
import json
import sys
import time
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent))
import run_scale  # noqa: E402  (bench/ is not a package)
import xla_cpu  # noqa: E402

TOLERANCE = 3.0  # ncc's error against f32 over bf16 JAX's, at most
JOBS = ("HLOToTensorizer", "Frontend", "WalrusDriver", "Packager")


def decoder(layers: int, seq: int, d: int, ffn: int, heads: int, scan: bool = False):
    """(model function, its argument specs). `scan`: the layers' weights stacked and the layers one
    `lax.scan` over them (an HLO while loop of `layers` trips), as Flax's nn.scan writes a stack."""
    import jax
    import jax.numpy as jnp

    head = d // heads

    def rmsnorm(x, gain):
        wide = x.astype(jnp.float32)
        scale = jax.lax.rsqrt(jnp.mean(wide * wide, axis=-1, keepdims=True) + 1e-6)
        return (wide * scale * gain).astype(x.dtype)

    def rope(x, cos, sin):
        x1, x2 = x[..., : head // 2], x[..., head // 2:]
        return jnp.concatenate([x1 * cos - x2 * sin, x1 * sin + x2 * cos], axis=-1)

    def layer(x, p, cos, sin, mask):
        h = rmsnorm(x, p["g1"])
        q, k, v = ((h @ p[w]).reshape(seq, heads, head).transpose(1, 0, 2) for w in ("wq", "wk", "wv"))
        q, k = rope(q, cos, sin), rope(k, cos, sin)
        scores = jnp.einsum("hqd,hkd->hqk", q, k, preferred_element_type=jnp.float32) / np.sqrt(head) + mask
        attention = jax.nn.softmax(scores, axis=-1).astype(x.dtype)
        o = jnp.einsum("hqk,hkd->hqd", attention, v).transpose(1, 0, 2).reshape(seq, d)
        x = x + o @ p["wo"]
        h = rmsnorm(x, p["g2"])
        return x + (jax.nn.silu(h @ p["w1"]) * (h @ p["w3"])) @ p["w2"]

    def model(x, params, cos, sin, mask):
        for p in params:
            x = layer(x, p, cos, sin, mask)
        return x

    def scanned(x, stacked, cos, sin, mask):
        return jax.lax.scan(lambda x, p: (layer(x, p, cos, sin, mask), None), x, stacked)[0]

    bf16 = jnp.bfloat16
    shapes = {"g1": ((d,), jnp.float32), "g2": ((d,), jnp.float32), "w1": ((d, ffn), bf16),
              "w2": ((ffn, d), bf16), "w3": ((d, ffn), bf16), "wk": ((d, d), bf16), "wo": ((d, d), bf16),
              "wq": ((d, d), bf16), "wv": ((d, d), bf16)}  # sorted: JAX flattens a dict by its keys
    params = [{name: jax.ShapeDtypeStruct(*shape) for name, shape in shapes.items()} for _ in range(layers)]
    if scan:
        params = {name: jax.ShapeDtypeStruct((layers, *shape), dtype)
                  for name, (shape, dtype) in shapes.items()}
    specs = (jax.ShapeDtypeStruct((seq, d), bf16), params, jax.ShapeDtypeStruct((seq, head // 2), bf16),
             jax.ShapeDtypeStruct((seq, head // 2), bf16), jax.ShapeDtypeStruct((seq, seq), jnp.float32))
    return (scanned if scan else model), specs


def seeded_inputs(specs, seq: int, d: int, ffn: int, heads: int) -> tuple:
    """Inputs of the model's shape: unit activations, weights scaled by 1/sqrt(fan-in), gains near
    1, RoPE's tables and a causal mask."""
    import jax.numpy as jnp

    rng = np.random.default_rng(0)
    head = d // heads

    def normal(shape, scale, dtype):
        return jnp.asarray(rng.standard_normal(shape, dtype=np.float32) * scale).astype(dtype)

    params = []
    for layer in specs[1]:
        params.append({name: (normal(spec.shape, 0.1, jnp.float32) + 1 if name.startswith("g")
                              else normal(spec.shape, spec.shape[0] ** -0.5, spec.dtype))
                       for name, spec in layer.items()})
    angle = np.arange(seq)[:, None] * 10000.0 ** (-np.arange(head // 2) / (head // 2))[None, :]
    mask = np.where(np.tril(np.ones((seq, seq))) > 0, 0.0, -1e9).astype(np.float32)
    return (normal((seq, d), 1.0, jnp.bfloat16), params, jnp.asarray(np.cos(angle)).astype(jnp.bfloat16),
            jnp.asarray(np.sin(angle)).astype(jnp.bfloat16), jnp.asarray(mask))


def job_records(workdir: Path) -> dict[str, dict]:
    records = {}
    for job in JOBS:
        folder = run_scale.job_folder(workdir, job)
        if folder is not None and (folder / "record.json").is_file():
            records[job] = json.loads((folder / "record.json").read_text())
    return records


def check_layer(neff: Path, model, inputs, scratch: Path) -> dict[str, float]:
    """`ncc run` on the inputs; its output against JAX's in bf16 and in f32."""
    import subprocess

    import jax
    import jax.numpy as jnp

    flat = jax.tree_util.tree_leaves(inputs)
    np.savez(scratch / "in.npz", **{f"arg{i}": np.asarray(a) for i, a in enumerate(flat)})
    started = time.perf_counter()
    subprocess.run([sys.executable, "-m", "ncc.orchestrator", "run", str(neff), "--inputs",
                    str(scratch / "in.npz"), "--output", str(scratch / "out.npz"), "--report",
                    str(scratch / "report.json")], check=True)
    run_s = time.perf_counter() - started
    report = json.loads((scratch / "report.json").read_text())
    out = np.load(scratch / "out.npz")["out0"].astype(np.float32)
    bf16 = np.asarray(jax.jit(model)(*inputs).astype(jnp.float32))
    wide = jax.tree_util.tree_map(lambda a: jnp.asarray(a, jnp.float32), inputs)
    f32 = np.asarray(jax.jit(model)(*wide))

    def error(a: np.ndarray) -> float:
        return float(np.linalg.norm(a - f32) / np.linalg.norm(f32))

    return {"run_s": run_s, "simulated_us": report["simulated_ns"] / 1e3, "races": report["race_count"],
            "deadlock": report["deadlock"] is not None, "error_ncc": error(out),
            "error_jax_bf16": error(bf16)}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--layers", default="1,32")
    parser.add_argument("--seq", type=int, default=2048)
    parser.add_argument("--d", type=int, default=4096)
    parser.add_argument("--ffn", type=int, default=11008)
    parser.add_argument("--heads", type=int, default=32)
    parser.add_argument("--timeout", type=float, default=900.0)
    parser.add_argument("--keep", type=Path, help="keep HLO, work dirs and NEFFs here")
    parser.add_argument("--no-run", action="store_true", help="do not simulate the one-layer model")
    parser.add_argument("--scan", action="store_true",
                        help="the layers as one lax.scan over stacked weights (a while loop), "
                             "not a Python loop")
    args = parser.parse_args(argv)
    try:
        import jax  # noqa: F401
    except ImportError:
        print("bench-decoder needs JAX (pip install -e .[jax])", file=sys.stderr)
        return 2
    failed = False
    with contextlib.ExitStack() as stack:
        scratch = run_scale.scratch_dir(stack, args.keep, "ncc-decoder-")
        print(f"decoder S={args.seq} D={args.d} F={args.ffn} heads={args.heads} bf16"
              f"{', layers as one lax.scan' if args.scan else ''}; {run_scale.machine()}")
        for layers in (int(n) for n in args.layers.split(",")):
            model, specs = decoder(layers, args.seq, args.d, args.ffn, args.heads, args.scan)
            hlo = scratch / f"decoder{layers}.hlo.pb"
            hlo.write_bytes(_lowered(model, specs).compiler_ir("hlo").as_serialized_hlo_module_proto())
            neff, workdir = scratch / f"decoder{layers}.neff", scratch / f"decoder{layers}.w"
            wall, error = run_scale.compile_with_timeout(hlo, neff, workdir, args.timeout, loops="auto")
            if error:
                print(f"{layers} layers: {error}")
                failed = True
                continue
            records = job_records(workdir)
            static, executed = run_scale.neff_instruction_counts(workdir)
            peak = max(int(r.get("peak_rss_bytes", 0)) for r in records.values())
            jobs = ", ".join(f"{job} {r.get('wall_s', 0):.1f}" for job, r in records.items())
            print(f"{layers} layers: compile {wall:.1f} s ({jobs}); peak RSS {peak / 2**30:.2f} GiB; "
                  f"NEFF {static:,} / executed {executed:,} instructions; "
                  f"XLA:CPU compile {xla_cpu.compile_seconds(model, specs):.2f} s")
            if layers == 1 and not args.no_run and not args.scan:
                check = check_layer(neff, model, seeded_inputs(specs, args.seq, args.d, args.ffn, args.heads),
                                    scratch)
                matches = (check["error_ncc"] <= TOLERANCE * check["error_jax_bf16"] and not check["races"]
                           and not check["deadlock"])
                failed |= not matches
                print(f"  ncc run {check['run_s']:.1f} s, simulated {check['simulated_us']:,.0f} us, "
                      f"races {check['races']}, deadlock {check['deadlock']}; relative L2 error against f32: "
                      f"ncc {check['error_ncc']:.4f}, JAX bf16 {check['error_jax_bf16']:.4f} -> "
                      f"{'match' if matches else 'MISMATCH'}")
    return 1 if failed else 0


def _lowered(model, specs):
    import jax

    return jax.jit(model).lower(*specs)


if __name__ == "__main__":
    sys.exit(main())
