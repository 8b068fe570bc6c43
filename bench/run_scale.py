"""Scale benchmark of the ncc compiler on generated HLO of growing size (`make bench-scale`).

For each family of bench/hlo_gen.py and each size: write the module's HLO text, compile it once
with `ncc compile` in a fresh work directory, and read the work directory's files:

  loops         how the compile kept loops: `rolled` (`ncc compile --loops rolled`: loops stay loops
                from the Frontend on) or `unrolled` (every loop unrolled; roll_loops rolls the
                streams codegen wrote); --loops picks which (default both, side by side)
  BIR instrs    instructions the Frontend job wrote (its bir.pb): unrolled, what the program executes
  NEFF instrs   entries of the per-engine streams the WalrusDriver job wrote (its program.pb): what
                the NEFF holds
  executed      the instructions those streams execute, loops expanded
  compile       end-to-end wall of `ncc compile`
  walrus wall / CPU / peak RSS
                the WalrusDriver job's record.json: wall_s, user_s + sys_s, peak_rss_bytes
  XLA:CPU       XLA's CPU compiler on the same function (hlo_gen.jax_function), timed in this run:
                median of REPS `jax.jit(f).lower(*ShapeDtypeStructs).compile()`, each on a new
                function object with JAX's caches cleared so each really compiles; n/a without JAX

and with --simulate, each NEFF's simulated time on seeded inputs (`ncc run`'s simulator), the
rolled one's over the unrolled one's when both ran;
then the wall of every walrus pass and the driver's peak RSS when it ended (the driver's --stats
file, stats.json in its job folder), and
per family the growth of walrus CPU time with BIR size: the log-log slope between consecutive
sizes and the least-squares slope over all of them (1 = linear, 2 = quadratic; the tool's start-up,
about half a second of CPU, flattens it at small sizes), and the same slope for each pass's wall.
A compile that fails or times out shows its one-line error in place of its numbers; the run goes
on, and exits 1 at the end.

    python bench/run_scale.py [--family chain,mlp,attention] [--sizes "n=200;n=1000"] [--reps 3]
                              [--ncc-reps 1] [--timeout 600] [--loops rolled,unrolled] [--simulate]
                              [--json FILE]

--sizes (with one --family) is a ';'-separated list of sizes, each a ','-separated list of
key=value (hlo_gen's parameters: chain n,rows,cols; mlp batch,d,layers; attention seq,d,layers;
bdot batch,m,k,n; scan steps,batch,hidden), or a bare number for the family's main parameter
(chain n, mlp batch, attention layers, bdot batch, scan steps) on the family's default shape.
"""

from __future__ import annotations

import argparse
import contextlib
import inspect
import json
import math
import os
import platform
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
import hlo_gen  # noqa: E402  (bench/ is not a package)
import run_bench  # noqa: E402
import xla_cpu  # noqa: E402

# The default run: about 8 minutes on 2 cores (chain n=12500, 100k BIR, and XLA compiling it are most of it).
DEFAULT_FAMILIES = ("chain", "mlp", "attention", "scan")
BASE: dict[str, dict[str, int]] = {  # the shape a bare --sizes number is applied to
    "chain": {},
    "mlp": {"d": 1024},
    "attention": {"seq": 512, "d": 512},
    "bdot": {"m": 128, "k": 128, "n": 128},
    "scan": {},
}
MAIN_PARAMETER = {"chain": "n", "mlp": "batch", "attention": "layers", "bdot": "batch", "scan": "steps"}
DEFAULT_SIZES: dict[str, list[dict[str, int]]] = {
    # on f32[512,1024]: one fused nest, 8 BIR instructions per op (4 row tiles, each cut in two by retile)
    "chain": [{"n": n} for n in (500, 2000, 12500)],
    "mlp": [{"batch": b, "d": 1024} for b in (256, 512, 1024)] + [{"batch": 1024, "d": 2048}],
    "attention": [{"seq": 512, "d": 512, "layers": layers} for layers in (1, 2, 3, 4)],
    "bdot": [{"batch": batch, "m": 128, "k": 128, "n": 128} for batch in (4, 16, 64)],
    "scan": [{"steps": steps} for steps in (500, 2000)],
}
DEFAULT_TIMEOUT_S = 900.0
STOP_GRACE_S = 30.0  # after SIGINT, how long `ncc compile` gets to stop its job cleanly


@dataclass
class ScaleResult:
    """One size of one family; `error` is the compile's one-line error, if it failed."""

    family: str
    size: dict[str, int]
    loops: str = "rolled"
    bir_instructions: int | None = None
    neff_instructions: int | None = None
    executed_instructions: int | None = None
    simulated_ns: float | None = None
    compile_wall_s: float | None = None  # end-to-end `ncc compile`
    walrus_wall_s: float | None = None
    walrus_user_s: float | None = None
    walrus_sys_s: float | None = None
    walrus_peak_rss_bytes: int | None = None
    pass_wall_s: dict[str, float] = field(default_factory=dict)  # stats.json, in pipeline order
    pass_peak_rss_bytes: dict[str, int] = field(default_factory=dict)  # the driver's peak when each ended
    xla_cpu_compile_s: float | None = None  # median of `xla_reps` (None without JAX)
    xla_reps: int = 0
    # every ncc compile's walrus wall when --ncc-reps > 1; the other fields are the median one's
    walrus_wall_runs: list[float] = field(default_factory=list)
    error: str = ""

    @property
    def label(self) -> str:
        return ",".join(f"{key}={value}" for key, value in self.size.items())

    @property
    def compiled(self) -> bool:
        return self.compile_wall_s is not None

    @property
    def walrus_cpu_s(self) -> float | None:
        if self.walrus_user_s is None or self.walrus_sys_s is None:
            return None
        return self.walrus_user_s + self.walrus_sys_s

    @property
    def ratio_to_xla(self) -> float | None:
        if not self.compile_wall_s or not self.xla_cpu_compile_s:
            return None
        return self.compile_wall_s / self.xla_cpu_compile_s

    def as_json(self) -> dict[str, object]:
        return {
            **asdict(self),
            "label": self.label,
            "walrus_cpu_s": self.walrus_cpu_s,
            "ratio_to_xla": self.ratio_to_xla,
        }


# -- sizes -----------------------------------------------------------------------------------------


def ordered(family: str, size: dict[str, int]) -> dict[str, int]:
    """The size's keys in the order of hlo_gen's parameters (unknown keys last: hlo_gen refuses them)."""
    names = list(inspect.signature(hlo_gen.FAMILIES[family]).parameters)
    return dict(
        sorted(size.items(), key=lambda item: names.index(item[0]) if item[0] in names else len(names))
    )


def parse_sizes(family: str, text: str) -> list[dict[str, int]]:
    """'n=3,rows=128,cols=128;n=6,rows=128,cols=128' or '200;1000' -> sizes of `family`."""
    sizes = []
    for item in filter(None, (part.strip() for part in text.split(";"))):
        if item.isdigit():
            sizes.append(ordered(family, {**BASE[family], MAIN_PARAMETER[family]: int(item)}))
            continue
        size: dict[str, int] = {}
        for pair in filter(None, (p.strip() for p in item.split(","))):
            key, eq, value = pair.partition("=")
            if not eq or not value.strip().isdigit():
                raise ValueError(f"size {item!r}: {pair!r} is not key=integer")
            size[key.strip()] = int(value)
        sizes.append(ordered(family, size))
    if not sizes:
        raise ValueError(f"no sizes in {text!r}")
    return sizes


# -- measuring -------------------------------------------------------------------------------------


def compile_with_timeout(model: Path, neff: Path, workdir: Path, timeout_s: float,
                         loops: str = "rolled") -> tuple[float, str]:
    """Run `ncc compile` (its own per-job --timeout too); (wall, one-line error or "")."""
    argv = [
        sys.executable,
        "-m",
        "ncc.orchestrator",
        "compile",
        str(model),
        "--output",
        str(neff),
        "--workdir",
        str(workdir),
        "--verbose",
        "0",
        "--timeout",
        f"{timeout_s:g}",
        "--loops",
        loops,
    ]
    started = time.perf_counter()
    proc = subprocess.Popen(argv, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        stdout, stderr = proc.communicate(timeout=timeout_s + STOP_GRACE_S)
    except subprocess.TimeoutExpired:
        proc.send_signal(signal.SIGINT)  # the driver stops its compile child and the running job
        try:
            proc.communicate(timeout=STOP_GRACE_S)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.communicate()
        return time.perf_counter() - started, f"timed out after {timeout_s:g} s"
    wall = time.perf_counter() - started
    if proc.returncode != 0:
        done = subprocess.CompletedProcess(argv, proc.returncode, stdout, stderr)
        return wall, run_bench.last_line(done, "ncc compile")
    return wall, ""


def job_folder(workdir: Path, job: str) -> Path | None:
    folders = sorted(workdir.glob(f"[0-9][0-9]_{job}"))
    return folders[0] if folders else None


def neff_instruction_counts(workdir: Path) -> tuple[int | None, int | None]:
    """(entries of the per-engine streams of the WalrusDriver job's program.pb: what the NEFF holds,
    the instructions they execute)."""
    from ncc.schemas import bir_pb2
    from ncc.tools.common import loops

    folder = job_folder(workdir, "WalrusDriver")
    if folder is None or not (folder / "program.pb").is_file():
        return None, None
    program = bir_pb2.Program()
    program.ParseFromString((folder / "program.pb").read_bytes())
    static = sum(len(stream.instructions) for stream in program.streams)
    return static, loops.executed_instructions(program.streams, "E603")


def simulated_time(neff: Path) -> float:
    """The NEFF's simulated ns on seeded inputs (races checked, as `ncc run` does)."""
    import numpy as np

    from ncc.tools.packager.neff import read_neff
    from ncc.tools.sim.api import simulate_neff

    program = read_neff(neff)
    rng = np.random.default_rng(0)
    inputs = {f"arg{t.index}": (0.1 * rng.standard_normal(tuple(t.shape))).astype(np.float32)
              for t in program.hbm if t.role == 1}  # INPUT
    result = simulate_neff(program, inputs)
    if result.races or result.deadlock:
        raise RuntimeError(f"the simulator found {len(result.races)} races / deadlock {result.deadlock!r}")
    return result.simulated_ns


def read_walrus_job(workdir: Path, result: ScaleResult) -> None:
    """The WalrusDriver job's record (time, memory) and the per-pass walls of its stats.json."""
    folder = job_folder(workdir, "WalrusDriver")
    if folder is None:
        return
    record_path = folder / "record.json"
    if record_path.is_file():
        record = json.loads(record_path.read_text())
        result.walrus_wall_s = float(record.get("wall_s", 0.0))
        result.walrus_user_s = float(record.get("user_s", 0.0))
        result.walrus_sys_s = float(record.get("sys_s", 0.0))
        result.walrus_peak_rss_bytes = int(record.get("peak_rss_bytes", 0))
    stats_path = folder / "stats.json"
    if stats_path.is_file():
        stats = json.loads(stats_path.read_text())
        result.pass_wall_s = {entry["label"]: float(entry["wall_s"]) for entry in stats.get("passes", [])}
        result.pass_peak_rss_bytes = {
            entry["label"]: int(entry.get("peak_rss_bytes", 0)) for entry in stats.get("passes", [])
        }


def xla_cpu_compile_time(family: str, size: dict[str, int], reps: int) -> float | None:
    """XLA:CPU's compile time of the family's JAX twin (xla_cpu.compile_seconds); None without JAX."""
    made = hlo_gen.jax_function(family, **size)
    if made is None:
        return None
    import jax
    import jax.numpy as jnp

    function, shapes = made
    specs = [jax.ShapeDtypeStruct(shape, jnp.float32) for shape in shapes]
    return xla_cpu.compile_seconds(function, specs, reps)


def bench_size(
    family: str, size: dict[str, int], reps: int, timeout_s: float, scratch: Path, ncc_reps: int = 1,
    loops: str = "rolled", simulate: bool = False,
) -> ScaleResult:
    """Compile one generated module with ncc `ncc_reps` times, each in a fresh work directory (the
    result is the run of median walrus wall), `simulate` it, and time XLA:CPU on the same function
    (`reps` 0: not)."""
    name = f"{family}_{'_'.join(str(value) for value in size.values())}_{loops}"
    model = scratch / f"{name}.hlo"
    try:
        model.write_text(hlo_gen.hlo_text(family, **size))
    except (KeyError, TypeError) as err:
        error = f"bad size for {family}: {run_bench.one_line(err)}"
        return ScaleResult(family=family, size=dict(size), loops=loops, error=error)
    runs = []
    for _ in range(ncc_reps):
        result = ScaleResult(family=family, size=dict(size), loops=loops)
        workdir = scratch / f"{name}.ncc-work"
        shutil.rmtree(workdir, ignore_errors=True)  # a work directory left by an earlier run would resume
        wall, error = compile_with_timeout(model, scratch / f"{name}.neff", workdir, timeout_s, loops)
        result.compile_wall_s, result.error = (None, error) if error else (wall, "")
        result.bir_instructions = run_bench.bir_instruction_count(workdir)
        result.neff_instructions, result.executed_instructions = neff_instruction_counts(workdir)
        read_walrus_job(workdir, result)
        runs.append(result)
        if error:
            break
    if runs[-1].error or ncc_reps == 1:
        result = runs[-1]
    else:
        result = sorted(runs, key=lambda r: r.walrus_wall_s or 0.0)[len(runs) // 2]
        result.walrus_wall_runs = [r.walrus_wall_s or 0.0 for r in runs]
    if simulate and result.compiled:
        try:
            result.simulated_ns = simulated_time(scratch / f"{name}.neff")
        except Exception as err:  # a simulation that cannot run is a note, not the end of the run
            result.error = f"simulate: {run_bench.one_line(err)}"
    try:
        result.xla_cpu_compile_s = xla_cpu_compile_time(family, size, reps) if reps else None
        result.xla_reps = reps if result.xla_cpu_compile_s is not None else 0
    except Exception as err:  # XLA failing on one size must not cost the rest of the run
        note = f"XLA:CPU: {run_bench.one_line(err)}"
        result.error = f"{result.error}; {note}" if result.error else note
    return result


# -- growth ----------------------------------------------------------------------------------------


def slope(points: list[tuple[float, float]]) -> float | None:
    """Least-squares slope of log y on log x (two points: the slope between them)."""
    logs = [(math.log(x), math.log(y)) for x, y in points if x > 0 and y > 0]
    if len(logs) < 2:
        return None
    mean_x = sum(x for x, _ in logs) / len(logs)
    mean_y = sum(y for _, y in logs) / len(logs)
    spread = sum((x - mean_x) ** 2 for x, _ in logs)
    if spread == 0:
        return None
    return sum((x - mean_x) * (y - mean_y) for x, y in logs) / spread


def compiled_sizes(results: list[ScaleResult], family: str, loops: str | None = None) -> list[ScaleResult]:
    """The family's sizes that compiled (one loop mode: the first measured, or `loops`), by growing
    executed instructions."""
    loops = loops or next((r.loops for r in results if r.family == family), "rolled")
    done = [r for r in results if r.family == family and r.loops == loops and r.compiled
            and r.executed_instructions]
    return sorted(done, key=lambda r: r.executed_instructions or 0)


def growth(results: list[ScaleResult]) -> dict[str, dict[str, object]]:
    """Per family: the exponent of walrus CPU time in BIR size, step by step and overall, and the
    overall exponent of each pass's wall (which pass grows fastest)."""
    out: dict[str, dict[str, object]] = {}
    for family, loops in dict.fromkeys((r.family, r.loops) for r in results):
        done = [r for r in compiled_sizes(results, family, loops) if r.walrus_cpu_s]
        steps = [
            {
                "from": a.label,
                "to": b.label,
                "exponent": slope(
                    [(a.executed_instructions, a.walrus_cpu_s), (b.executed_instructions, b.walrus_cpu_s)]
                ),
            }
            for a, b in zip(done, done[1:], strict=False)
        ]
        overall = slope([(r.executed_instructions, r.walrus_cpu_s) for r in done])
        passes = list(dict.fromkeys(label for r in done for label in r.pass_wall_s))
        per_pass = {
            label: slope([(r.executed_instructions, r.pass_wall_s[label]) for r in done
                          if label in r.pass_wall_s])
            for label in passes
        }
        out[f"{family} {loops}"] = {
            "steps": steps, "overall": overall, "sizes": len(done), "passes": per_pass,
        }
    return out


# -- output ----------------------------------------------------------------------------------------


def _splice_errors(lines: list[str], rows: list[ScaleResult]) -> list[str]:
    """Replace a failed row's empty cells by its one-line error (lines = header, rule, rows)."""
    widths = [len(cell) for cell in lines[1].split("  ")]
    prefix = widths[0] + 2 + widths[1] + 2
    return lines[:2] + [
        line[:prefix] + f"FAILED: {r.error}" if not r.compiled else line
        for line, r in zip(lines[2:], rows, strict=True)
    ]


def render(results: list[ScaleResult], reps: int) -> str:
    fmt = run_bench._fmt
    header = [
        "family",
        "size",
        "loops",
        "BIR instrs",
        "NEFF instrs",
        "executed",
        "compile",
        "walrus wall",
        "walrus CPU",
        "peak RSS",
        "simulated",
        f"XLA:CPU (median of {reps})",
        "ours/XLA",
    ]
    rows = []
    for r in results:
        if not r.compiled:
            rows.append([r.family, r.label, r.loops] + [""] * (len(header) - 3))
            continue
        rows.append(
            [
                r.family,
                r.label,
                r.loops,
                fmt(r.bir_instructions, ","),
                fmt(r.neff_instructions, ","),
                fmt(r.executed_instructions, ","),
                fmt(r.compile_wall_s, ".2f", " s"),
                fmt(r.walrus_wall_s, ".2f", " s"),
                fmt(r.walrus_cpu_s, ".2f", " s"),
                fmt(
                    None if r.walrus_peak_rss_bytes is None else r.walrus_peak_rss_bytes / 2**20, ".0f", " MB"
                ),
                fmt(None if r.simulated_ns is None else r.simulated_ns / 1000, ".1f", " us"),
                fmt(r.xla_cpu_compile_s, ".3f", " s"),
                fmt(r.ratio_to_xla, ".0f" if (r.ratio_to_xla or 0) >= 10 else ".2f", "x"),  # the chain: 0.31x
            ]
        )
    lines = _splice_errors(run_bench._table(header, rows), results) if results else []
    lines += _side_by_side(results)

    exponents = growth(results)
    for key, info in exponents.items():
        family, loops = key.split(" ")
        done = [r for r in compiled_sizes(results, family, loops) if r.pass_wall_s]
        if not done:
            continue
        passes = list(dict.fromkeys(label for r in done for label in r.pass_wall_s))
        rows = [
            [label, *(fmt(r.pass_wall_s.get(label), ".3f") for r in done), fmt(info["passes"][label], ".2f")]
            for label in passes
        ]
        rows.append(["all passes", *(fmt(sum(r.pass_wall_s.values()), ".3f") for r in done), ""])
        lines += [
            "",
            f"{key}: walrus wall per pass (s; the driver's stats.json) and its exponent in executed "
            "instructions",
        ]
        lines += run_bench._table(["pass", *(r.label for r in done), "exponent"], rows)
        rows = [
            [label, *(fmt(r.pass_peak_rss_bytes.get(label, 0) / 2**20 or None, ".0f") for r in done)]
            for label in passes
        ]
        lines += ["", f"{key}: walrus peak RSS when each pass ended (MB; it only grows)"]
        lines += run_bench._table(["pass", *(r.label for r in done)], rows)

    lines += ["", "growth: exponent of walrus CPU time in executed instructions (log-log; 1 linear, "
              "2 quadratic)"]
    for key, info in exponents.items():
        steps = "  ".join(f"{s['from']} -> {s['to']}: {fmt(s['exponent'], '.2f')}" for s in info["steps"])
        overall = fmt(info["overall"], ".2f")
        detail = steps or "fewer than two sizes compiled"
        lines.append(f"  {key}: overall {overall}   ({detail})")

    repeated = [r for r in results if r.walrus_wall_runs]
    if repeated:
        lines += ["", "walrus wall of every ncc compile (s; the row above is the median one)"]
        lines += [f"  {r.family} {r.label} {r.loops}: "
                  + ", ".join(f"{wall:.2f}" for wall in r.walrus_wall_runs) for r in repeated]

    notes = [r for r in results if r.error and r.compiled]
    if notes:
        lines += [""] + [f"{r.family} {r.label} {r.loops}: note: {r.error}" for r in notes]
    return "\n".join(lines)


def _side_by_side(results: list[ScaleResult]) -> list[str]:
    """Rolled against unrolled, per size compiled both ways: compile wall, NEFF size, simulated time."""
    fmt = run_bench._fmt
    by_key = {(r.family, r.label, r.loops): r for r in results if r.compiled}
    rows = []
    for (family, label, loops), rolled in by_key.items():
        unrolled = by_key.get((family, label, "unrolled"))
        if loops != "rolled" or unrolled is None:
            continue
        sim = None
        if rolled.simulated_ns and unrolled.simulated_ns:
            sim = rolled.simulated_ns / unrolled.simulated_ns
        static = None
        if rolled.neff_instructions and rolled.executed_instructions:
            static = 100 * rolled.neff_instructions / rolled.executed_instructions
        rows.append([
            family, label,
            fmt(rolled.compile_wall_s, ".2f", " s"), fmt(unrolled.compile_wall_s, ".2f", " s"),
            fmt(unrolled.compile_wall_s / rolled.compile_wall_s, ".1f", "x"),
            fmt(static, ".2f", " %"),
            fmt(None if rolled.simulated_ns is None else rolled.simulated_ns / 1000, ".1f", " us"),
            fmt(None if unrolled.simulated_ns is None else unrolled.simulated_ns / 1000, ".1f", " us"),
            fmt(sim, ".3f"),
        ])
    if not rows:
        return []
    header = ["family", "size", "compile rolled", "compile unrolled", "speed-up", "NEFF / executed",
              "sim rolled", "sim unrolled", "rolled / unrolled"]
    return ["", "loops kept rolled against unrolled (same module, same run)", *run_bench._table(header, rows)]


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument(
        "--family",
        default=",".join(DEFAULT_FAMILIES),
        help=f"comma-separated families of {', '.join(hlo_gen.FAMILIES)} "
        f"(default {','.join(DEFAULT_FAMILIES)})",
    )
    parser.add_argument("--sizes", help="sizes of the one --family, e.g. 'n=200;n=1000' or '200;1000'")
    parser.add_argument("--reps", type=int, default=3, help="XLA:CPU compiles per size (median; default 3)")
    parser.add_argument(
        "--ncc-reps", type=int, default=1,
        help="ncc compiles per size; the row is the one of median walrus wall, each run's listed (default 1)",
    )
    parser.add_argument(
        "--timeout",
        type=float,
        default=DEFAULT_TIMEOUT_S,
        help=f"seconds one ncc compile, and each of its jobs, may take (default {DEFAULT_TIMEOUT_S:g})",
    )
    parser.add_argument(
        "--loops", default="rolled,unrolled",
        help="comma-separated loop modes to compile each size with (rolled, unrolled; default both)",
    )
    parser.add_argument("--simulate", action="store_true",
                        help="also run each NEFF in the simulator on seeded inputs (slow at 100k "
                        "instructions)")
    parser.add_argument("--json", type=Path, help="also write the results as JSON")
    parser.add_argument(
        "--keep", type=Path, metavar="DIR", help="write the modules and work directories here and keep them"
    )
    args = parser.parse_args(argv)
    families = [name for name in args.family.split(",") if name]
    unknown = [name for name in families if name not in hlo_gen.FAMILIES]
    if unknown or not families:
        parser.error(f"unknown family {','.join(unknown)}; known: {', '.join(hlo_gen.FAMILIES)}")
    if args.reps < 0 or args.ncc_reps < 1:
        parser.error("--reps must be at least 0 and --ncc-reps at least 1")
    modes = [mode for mode in args.loops.split(",") if mode]
    if not modes or any(mode not in ("rolled", "unrolled") for mode in modes):
        parser.error(f"--loops {args.loops!r}: a comma-separated list of rolled and unrolled")
    if args.timeout <= 0:
        parser.error("--timeout must be positive")
    if args.sizes is not None:
        if len(families) != 1:
            parser.error("--sizes needs exactly one --family")
        try:
            plan = [(families[0], size) for size in parse_sizes(families[0], args.sizes)]
        except ValueError as err:
            parser.error(str(err))
    else:
        plan = [(family, size) for family in families for size in DEFAULT_SIZES[family]]

    results = []
    with contextlib.ExitStack() as stack:
        scratch = scratch_dir(stack, args.keep, "ncc-bench-scale-")
        for family, size in plan:
            for number, mode in enumerate(modes):  # XLA:CPU timed once per size
                result = bench_size(family, size, args.reps if number == 0 else 0, args.timeout, scratch,
                                    args.ncc_reps, mode, args.simulate)
                if number:
                    result.xla_cpu_compile_s = results[-1].xla_cpu_compile_s
                    result.xla_reps = results[-1].xla_reps
                results.append(result)
                status = f"failed: {result.error}" if result.error else f"{result.compile_wall_s:.1f} s"
                print(f"  {family} {result.label} {mode}: {status}", file=sys.stderr, flush=True)
    print(render(results, args.reps))
    if not args.keep and any(not r.compiled for r in results):
        print("(the work directories named above are removed; --keep DIR keeps them)")
    if args.json:
        document = {
            "machine": machine() | {"jax": _jax_version()},
            "reps": args.reps,
            "timeout_s": args.timeout,
            "results": [r.as_json() for r in results],
            "growth": growth(results),
        }
        args.json.write_text(json.dumps(document, indent=1) + "\n")
    return 1 if any(r.error for r in results) else 0


def machine() -> dict[str, object]:
    """What a benchmark's JSON says of the machine it ran on."""
    return {"cpus": os.cpu_count(), "python": platform.python_version(), "platform": platform.platform()}


def scratch_dir(stack: contextlib.ExitStack, keep: Path | None, prefix: str) -> Path:
    """Where a benchmark writes its files: `keep` (created) when given, else a temporary folder
    that goes when `stack` closes."""
    if keep:
        keep.mkdir(parents=True, exist_ok=True)
        return keep
    return Path(stack.enter_context(tempfile.TemporaryDirectory(prefix=prefix)))


def _jax_version() -> str | None:
    if not run_bench.jax_installed():
        return None
    import jax

    return jax.__version__


if __name__ == "__main__":
    sys.exit(main())
