"""How close compiled code comes to the machine's limits, with and without the Penguin optimizer,
and what software pipelining adds (`make bench-fusion`).

For each model it compiles four times at --optlevel (default 2): with `--penguin-passes=none`
(unfused), with the default Penguin passes (fused: what -O1 and above run, from fusion to
invariant_loads; named so that -O0 runs them too), and the same with `--num-stages 2` and
`--num-stages 3` (every loop the pipeline pass can pipeline legally, in 2 or 3 stages). It runs
each NEFF in the simulator and prints, side by side:

  bytes/min   HBM bytes the program's DMAs move ÷ the minimum (every input, constant and output
              moved once)
  sim/bound   simulated time ÷ the first-principles bound max(FLOPs ÷ PE peak, minimum bytes ÷
              HBM bandwidth); PE peak is 128x128 MACs per cycle at the PE clock, a quarter of
              that for fp32 operands (the target's fp32_matmul_factor)
  simulated   µs: unfused, then fused with num_stages 1 (no pipelining), 2 and 3
  loops       how many loops --num-stages 3 pipelined
  speedup     unfused ÷ fused (fusion), and num_stages 1 ÷ num_stages 3 (pipe)
  ÷order      fused (num_stages 1) simulated time ÷ its order bound: the first transfer's end +
              the busiest compute engine's work + the shortest transfer. No order of the same
              instructions on the same engines beats that bound (the busiest engine starts no
              earlier than the first data arrives, and its last result still has to be stored),
              so 1.00 here means pipelining, which only reorders iterations, cannot pay

Models: every bundled model (its own inputs), generated MLPs gelu(x @ W1) @ W2 of widths --widths,
and three load → compute → store loops over row tiles: `tile_chain`, the JAX pipelining fixture
(tests/data/pipelined_chain, its annotation removed: tanh and exp on ACT alternating with × 0.5 on
DVE) on f32[2048, 64], 16 tiles; `tile_chain32`, the same function on f32[4096, 64], 32 tiles
(random inputs); and `chain16`, six elementwise ops on f32[2048, 512], 16 tiles (random inputs).

Pipelining shows at -O0, where each engine runs its instructions in program order: at -O1 and
above the backend's list scheduler already overlaps the iterations of the unannotated loop.

    python bench/run_fusion.py [--models gelu,mlp] [--widths 1024,2048] [--optlevel 0] [--loops rolled]
                               [--json FILE]

--loops (auto, rolled or unrolled; default auto) is passed to every compile: `rolled` measures
what pipelining adds over loops that stay loops.
"""

from __future__ import annotations

import argparse
import json
import re
import statistics
import subprocess
import sys
import tempfile
from dataclasses import asdict, dataclass
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "bench"))

from hlo_gen import hlo_text  # noqa: E402

from ncc.schemas import bir_pb2, common_pb2, hlo_pb2  # noqa: E402
from ncc.tools.common import dtypes  # noqa: E402
from ncc.tools.common.hbm_traffic import hbm_bytes  # noqa: E402
from ncc.tools.hlo_opt.optimizer import DEFAULT_PASSES  # noqa: E402
from ncc.tools.target import load_target  # noqa: E402

NCC = [sys.executable, "-m", "ncc.orchestrator"]
FUSED = "--penguin-passes=" + ",".join(DEFAULT_PASSES)
VARIANTS = {"unfused": ["--penguin-passes=none"], "fused": [FUSED],
            "stages2": [FUSED, "--num-stages", "2"], "stages3": [FUSED, "--num-stages", "3"]}


@dataclass
class Measure:
    bytes_moved: int
    min_bytes: int
    flops: int
    simulated_ns: float
    bound_ns: float
    loops_pipelined: int
    order_bound_ns: float


def program_measures(bir: bir_pb2.Program) -> tuple[int, int, int, bool]:
    """(HBM bytes the DMAs move, the minimum, matmul FLOPs, any fp32 matmul) of a BIR program."""
    moved = sum(hbm_bytes(bir).values())
    flops, fp32 = 0, False
    for instr in bir.instructions:
        if instr.op == "matmul":
            stationary, moving = instr.inputs[0], instr.inputs[1]
            k = max(1, stationary.partition_count)
            flops += 2 * k * _free(stationary) * _free(moving)
            fp32 = fp32 or common_pb2.F32 in (stationary.dtype, moving.dtype)
    minimum = sum(int(np.prod(t.shape, dtype=np.int64)) * dtypes.itemsize(t.dtype) for t in bir.hbm
                  if t.role in (bir_pb2.INPUT, bir_pb2.OUTPUT, bir_pb2.CONSTANT))
    return moved, minimum, flops, fp32


def _free(ap: bir_pb2.AccessPattern) -> int:
    return int(np.prod([d.count for d in ap.dims], dtype=np.int64)) if ap.dims else 1


def random_inputs(bir: bir_pb2.Program, path: Path) -> None:
    rng = np.random.default_rng(0)
    arrays = {}
    for tensor in bir.hbm:
        if tensor.role == bir_pb2.INPUT:
            shape = tuple(tensor.shape)
            arrays[f"arg{tensor.index}"] = (rng.standard_normal(shape).astype(np.float32) / 4
                                            if dtypes.is_float(tensor.dtype) else np.zeros(shape, np.int32))
    np.savez(path, **arrays)


def measure(model: Path, inputs: Path | None, flags: list[str], folder: Path, optlevel: int) -> Measure:
    neff = folder / "m.neff"
    subprocess.run([*NCC, "compile", str(model), "--output", str(neff), "--optlevel", str(optlevel), *flags],
                   check=True, capture_output=True, text=True)
    frontend = next((folder / "m.ncc-work").glob("*_Frontend"))
    bir = bir_pb2.Program()
    bir.ParseFromString((frontend / "bir.pb").read_bytes())
    piped = re.search(r"loops_pipelined=(\d+)", (frontend / "stderr.log").read_text())
    moved, minimum, flops, fp32 = program_measures(bir)
    if inputs is None:
        inputs = folder / "inputs.npz"
        random_inputs(bir, inputs)
    report, trace = folder / "report.json", folder / "trace.json"
    subprocess.run([*NCC, "run", str(neff), "--inputs", str(inputs), "--output", str(folder / "out.npz"),
                    "--report", str(report), "--trace", str(trace)],
                   check=True, capture_output=True, text=True)
    simulated = float(json.loads(report.read_text())["simulated_ns"])
    target = load_target("trn1")
    macs_per_cycle = target.partitions * target.matmul_max_stationary_free
    peak = 2 * macs_per_cycle * target.clock_ghz[common_pb2.PE]  # FLOP per ns
    if fp32:
        peak /= float(target.costs.get("fp32_matmul_factor", 4))
    bound = max(flops / peak, minimum / target.hbm_bandwidth_gbps)  # GB/s is bytes per ns
    return Measure(moved, minimum, flops, simulated, bound, int(piped.group(1)) if piped else 0,
                   order_bound_ns(trace))


COMPUTE_ENGINES = ("PE", "ACT", "DVE", "POOL")


def order_bound_ns(trace: Path) -> float:
    """A bound no order of the trace's instructions on their engines beats: the first transfer's
    end (before it, no input is on chip), then the busiest compute engine's compute instructions
    (dma triggers, nops and waits left out), then the shortest transfer (the last result's store)."""
    events = json.loads(trace.read_text())["traceEvents"]
    threads = {e["tid"]: e["args"]["name"]
               for e in events if e.get("ph") == "M" and e["name"] == "thread_name"}
    work = dict.fromkeys(COMPUTE_ENGINES, 0.0)
    transfers = []
    for event in events:
        thread = threads.get(event["tid"], "") if event.get("ph") == "X" else ""
        if event.get("cat") == "dma_transfer":
            transfers.append((event["ts"] + event["dur"], event["dur"]))
        elif event.get("cat") == "instruction" and thread in work and event["args"].get("op") not in (
            "dma", "nop", "drain"
        ):
            work[thread] += event["dur"]
    if not transfers:
        return 0.0
    first_arrival = min(end for end, _ in transfers)
    return (first_arrival + max(work.values()) + min(duration for _, duration in transfers)) * 1e3  # µs → ns


def models(names: list[str] | None, widths: list[int], scratch: Path) -> list[tuple[str, Path, Path | None]]:
    shared = ROOT.parent / "shared" / "models"
    folder = shared if (shared / "index.json").exists() else ROOT / "models"
    found = []
    for name in json.loads((folder / "index.json").read_text()):
        if names is None or name in names:
            found.append((name, folder / f"{name}.hlo.pb", _inputs_only(folder / f"{name}.io.npz", scratch)))
    for width in widths:
        name = f"mlp_d{width}"
        if names is None or name in names:
            path = scratch / f"{name}.hlo"
            path.write_text(hlo_text("mlp", batch=1024, d=width, layers=2))
            found.append((name, path, None))
    if names is None or "tile_chain" in names:
        fixture = ROOT / "tests" / "data" / "pipelined_chain"
        module = hlo_pb2.HloModuleProto()
        module.ParseFromString(fixture.with_suffix(".hlo.pb").read_bytes())
        for computation in module.computations:
            for instr in computation.instructions:
                instr.ClearField("frontend_attributes")  # the --num-stages columns decide
        path = scratch / "tile_chain.hlo.pb"
        path.write_bytes(module.SerializeToString())
        found.append(("tile_chain", path, _inputs_only(fixture.with_suffix(".io.npz"), scratch)))
    if names is None or "tile_chain32" in names:
        path = scratch / "tile_chain32.hlo"
        text = (ROOT / "tests" / "data" / "pipelined_chain.hlo").read_text().replace("[2048,64]", "[4096,64]")
        path.write_text(re.sub(r", frontend_attributes=\{[^}]*\}", "", text))
        found.append(("tile_chain32", path, None))
    if names is None or "chain16" in names:
        path = scratch / "chain16.hlo"
        path.write_text(hlo_text("chain", n=6, rows=2048, cols=512))
        found.append(("chain16", path, None))
    return found


def _inputs_only(io: Path, scratch: Path) -> Path | None:
    if not io.exists():
        return None
    with np.load(io) as data:
        path = scratch / f"{io.name.split('.')[0]}.in.npz"
        np.savez(path, **{k: data[k] for k in data.files if k.startswith("arg")})
    return path


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--models", help="comma-separated model names (default: all)")
    parser.add_argument("--widths", default="1024,2048", help="generated MLP widths ('' for none)")
    parser.add_argument("--optlevel", type=int, default=2, choices=range(4), help="the backend's level")
    parser.add_argument("--loops", default="auto", choices=("auto", "rolled", "unrolled"),
                        help="ncc compile --loops for every compile")
    parser.add_argument("--json", type=Path, help="also write the measurements as JSON")
    args = parser.parse_args()
    widths = [int(w) for w in args.widths.split(",") if w]
    names = args.models.split(",") if args.models else None
    results: dict[str, dict[str, dict]] = {}
    print(f"-O{args.optlevel} --loops {args.loops}\n"
          f"{'model':<14} {'bytes/min':>15} {'sim/bound':>15}  {'simulated us':<38} {'loops':>5} "
          f"{'speedup':>15} {'÷order':>7}\n"
          f"{'':<14} {'unfused  fused':>15} {'unfused  fused':>15}  "
          f"{'unfused  stages=1        2        3':<38} {'':>5} {'fusion   pipe':>15}")
    with tempfile.TemporaryDirectory() as tmp:
        scratch = Path(tmp)
        for name, model, inputs in models(names, widths, scratch):
            row = {}
            for variant, flags in VARIANTS.items():
                folder = scratch / f"{name}.{variant}"
                folder.mkdir()
                row[variant] = measure(model, inputs, [*flags, "--loops", args.loops], folder, args.optlevel)
            results[name] = {k: asdict(v) for k, v in row.items()}
            u, f, s2, s3 = row["unfused"], row["fused"], row["stages2"], row["stages3"]
            times = "".join(f"{m.simulated_ns / 1e3:>9.1f}" for m in (u, f, s2, s3))
            print(f"{name:<14} {u.bytes_moved / u.min_bytes:>7.2f} {f.bytes_moved / f.min_bytes:>7.2f} "
                  f"{u.simulated_ns / u.bound_ns:>7.2f} {f.simulated_ns / f.bound_ns:>7.2f}  {times:<38} "
                  f"{s3.loops_pipelined:>5} {u.simulated_ns / f.simulated_ns:>6.2f}x "
                  f"{f.simulated_ns / s3.simulated_ns:>6.2f}x "
                  f"{f.simulated_ns / f.order_bound_ns if f.order_bound_ns else float('nan'):>7.3f}",
                  flush=True)
    for label, before, after in (("the Penguin optimizer", "unfused", "fused"),
                                 ("3-stage pipelining", "fused", "stages3")):
        speedups = [r[before]["simulated_ns"] / r[after]["simulated_ns"] for r in results.values()]
        if speedups:
            print(f"median speedup from {label}: {statistics.median(speedups):.2f}x "
                  f"(best {max(speedups):.2f}x)")
    if args.json:
        args.json.write_text(json.dumps(results, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
