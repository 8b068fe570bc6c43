"""How close compiled code comes to the machine's limits, with and without the Penguin optimizer
(`make bench-fusion`).

For each model it compiles twice at -O2 — once with the default Penguin passes (loop fusion and
dead-code elimination), once with `--penguin-passes=none` — runs each NEFF in the simulator and
prints, side by side:

  bytes/min   HBM bytes the program's DMAs move ÷ the minimum (every input, constant and output
              moved once)
  sim/bound   simulated time ÷ the first-principles bound max(FLOPs ÷ PE peak, minimum bytes ÷
              HBM bandwidth); PE peak is 128x128 MACs per cycle at the PE clock, a quarter of
              that for fp32 operands (the target's fp32_matmul_factor)
  speedup     unfused simulated time ÷ fused simulated time

Models: every bundled model (its own inputs) and generated MLPs gelu(x @ W1) @ W2 of widths
--widths (random inputs). Software pipelining (num_stages) is not built yet, so there is no
column for it.

    python bench/run_fusion.py [--models gelu,mlp] [--widths 1024,2048] [--json FILE]
"""

from __future__ import annotations

import argparse
import json
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

from ncc.schemas import bir_pb2, common_pb2  # noqa: E402
from ncc.tools.common import dtypes  # noqa: E402
from ncc.tools.target import load_target  # noqa: E402

NCC = [sys.executable, "-m", "ncc.orchestrator"]
VARIANTS = {"fused": [], "unfused": ["--penguin-passes=none"]}


@dataclass
class Measure:
    bytes_moved: int
    min_bytes: int
    flops: int
    simulated_ns: float
    bound_ns: float


def program_measures(bir: bir_pb2.Program) -> tuple[int, int, int, bool]:
    """(HBM bytes the DMAs move, the minimum, matmul FLOPs, any fp32 matmul) of a BIR program."""
    moved = 0
    flops, fp32 = 0, False
    for instr in bir.instructions:
        if instr.op in ("dma", "dma_gather", "dma_scatter"):
            side = instr.inputs[0] if instr.inputs[0].memory == common_pb2.HBM else instr.outputs[0]
            moved += _elements(side) * dtypes.itemsize(side.dtype)
        elif instr.op == "matmul":
            stationary, moving = instr.inputs[0], instr.inputs[1]
            k = max(1, stationary.partition_count)
            flops += 2 * k * _free(stationary) * _free(moving)
            fp32 = fp32 or common_pb2.F32 in (stationary.dtype, moving.dtype)
    minimum = sum(int(np.prod(t.shape, dtype=np.int64)) * dtypes.itemsize(t.dtype) for t in bir.hbm
                  if t.role in (bir_pb2.INPUT, bir_pb2.OUTPUT, bir_pb2.CONSTANT))
    return moved, minimum, flops, fp32


def _free(ap: bir_pb2.AccessPattern) -> int:
    return int(np.prod([d.count for d in ap.dims], dtype=np.int64)) if ap.dims else 1


def _elements(ap: bir_pb2.AccessPattern) -> int:
    return _free(ap) * (ap.partition_count if ap.memory != common_pb2.HBM and ap.partition_count else 1)


def random_inputs(bir: bir_pb2.Program, path: Path) -> None:
    rng = np.random.default_rng(0)
    arrays = {}
    for tensor in bir.hbm:
        if tensor.role == bir_pb2.INPUT:
            shape = tuple(tensor.shape)
            arrays[f"arg{tensor.index}"] = (rng.standard_normal(shape).astype(np.float32) / 4
                                            if dtypes.is_float(tensor.dtype) else np.zeros(shape, np.int32))
    np.savez(path, **arrays)


def measure(model: Path, inputs: Path | None, flags: list[str], folder: Path) -> Measure:
    neff = folder / "m.neff"
    subprocess.run([*NCC, "compile", str(model), "--output", str(neff), "--optlevel", "2", *flags],
                   check=True, capture_output=True, text=True)
    bir = bir_pb2.Program()
    bir.ParseFromString(next((folder / "m.ncc-work").glob("*_Frontend/bir.pb")).read_bytes())
    moved, minimum, flops, fp32 = program_measures(bir)
    if inputs is None:
        inputs = folder / "inputs.npz"
        random_inputs(bir, inputs)
    report = folder / "report.json"
    subprocess.run([*NCC, "run", str(neff), "--inputs", str(inputs), "--output", str(folder / "out.npz"),
                    "--report", str(report)], check=True, capture_output=True, text=True)
    simulated = float(json.loads(report.read_text())["simulated_ns"])
    target = load_target("trn1")
    macs_per_cycle = target.partitions * target.matmul_max_stationary_free
    peak = 2 * macs_per_cycle * target.clock_ghz[common_pb2.PE]  # FLOP per ns
    if fp32:
        peak /= float(target.costs.get("fp32_matmul_factor", 4))
    bound = max(flops / peak, minimum / target.hbm_bandwidth_gbps)  # GB/s is bytes per ns
    return Measure(moved, minimum, flops, simulated, bound)


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
    parser.add_argument("--json", type=Path, help="also write the measurements as JSON")
    args = parser.parse_args()
    widths = [int(w) for w in args.widths.split(",") if w]
    names = args.models.split(",") if args.models else None
    results: dict[str, dict[str, dict]] = {}
    header = (f"{'model':<14} {'bytes/min':>16} {'sim/bound':>16} {'simulated us':>20} {'speedup':>8}\n"
              f"{'':<14} {'unfused  fused':>16} {'unfused  fused':>16} {'unfused    fused':>20}")
    print(header)
    with tempfile.TemporaryDirectory() as tmp:
        scratch = Path(tmp)
        for name, model, inputs in models(names, widths, scratch):
            row = {}
            for variant, flags in VARIANTS.items():
                folder = scratch / f"{name}.{variant}"
                folder.mkdir()
                row[variant] = measure(model, inputs, flags, folder)
            results[name] = {k: asdict(v) for k, v in row.items()}
            u, f = row["unfused"], row["fused"]
            print(f"{name:<14} {u.bytes_moved / u.min_bytes:>7.2f} {f.bytes_moved / f.min_bytes:>7.2f}  "
                  f"{u.simulated_ns / u.bound_ns:>7.2f} {f.simulated_ns / f.bound_ns:>7.2f}  "
                  f"{u.simulated_ns / 1e3:>9.1f} {f.simulated_ns / 1e3:>9.1f}  "
                  f"{u.simulated_ns / f.simulated_ns:>7.2f}x", flush=True)
    speedups = [r["unfused"]["simulated_ns"] / r["fused"]["simulated_ns"] for r in results.values()]
    if speedups:
        print(f"median speedup from the Penguin optimizer: {statistics.median(speedups):.2f}x")
    if args.json:
        args.json.write_text(json.dumps(results, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
