"""`ncc farm INPUTS...`: compile many models with many Luigi workers, locally or on a luigid.

INPUTS are model files, folders of them, or manifests (one `path [compile flags]` per line).
Prints progress while it runs and a table at the end; `--report FILE.json` keeps the outcome of
every model. Exits 0 when every model compiled, otherwise with the exit code of the worst
failure (1 for compile errors in inputs, 4 for crashes). The work is the farm module's.
"""

from __future__ import annotations

import argparse
import os
import sys
from pathlib import Path
from typing import TYPE_CHECKING

from ncc.orchestrator.commands.compile import (
    add_compile_flags,
    add_result_flags,
    non_negative_int,
    positive_int,
    warn_not_stored,
)
from ncc.orchestrator.config import budget_tool_threads
from ncc.orchestrator.diagnostics import ExitCode, NccError
from ncc.orchestrator.options import CompileOptions
from ncc.orchestrator.pipeline import luigi_setup
from ncc.orchestrator.pipeline.stage_cache import CacheError, StageCache
from ncc.orchestrator.pipeline.workdir import WorkDir, write_json_atomic

if TYPE_CHECKING:
    from ncc.orchestrator.farm import farm as farm_types

DEFAULT_FARM_DIR = "ncc-farm"


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "inputs", nargs="+", type=Path, metavar="INPUT", help="model files, folders, manifests"
    )
    parser.add_argument(
        "--workers", type=positive_int, default=1, metavar="N", help="Luigi workers in this process"
    )
    parser.add_argument(
        "--scheduler-url",
        default="",
        metavar="URL",
        help="join the farm coordinated by this luigid (e.g. http://127.0.0.1:8082); "
        "default: a scheduler inside this process",
    )
    parser.add_argument(
        "--farm-dir",
        type=Path,
        default=Path(DEFAULT_FARM_DIR),
        metavar="DIR",
        help="inputs, work dirs and NEFFs of the farm (shared by all its workers; default ./ncc-farm)",
    )
    parser.add_argument(
        "--mem-per-job", type=positive_int, metavar="MB", help="memory each job reserves on its machine"
    )
    parser.add_argument(
        "--retries", type=non_negative_int, default=0, metavar="N", help="reruns of a failed job (default 0)"
    )
    parser.add_argument("--report", type=Path, metavar="FILE.json", help="write every model's outcome here")
    add_compile_flags(parser)


def _manifest_flag_parser() -> argparse.ArgumentParser:
    from ncc.orchestrator.cli import NccArgumentParser

    parser = NccArgumentParser(prog="manifest line", add_help=False)
    add_result_flags(parser)
    return parser


def _parse_manifest_flags(words: list[str] | tuple[str, ...]) -> dict[str, object]:
    """The CompileOptions fields a manifest line overrides."""
    parser = _manifest_flag_parser()
    args = parser.parse_args(list(words))
    given = {word.split("=", 1)[0] for word in words if word.startswith("--")}
    if any(word.startswith("-O") for word in words):  # -O2, -O 2
        given.add("--optlevel")
    overrides: dict[str, object] = {}
    if "--optlevel" in given:
        overrides["optlevel"] = args.optlevel
    if "--verify" in given:
        overrides["verify"] = True
    if "--walrus-passes" in given:
        overrides["walrus_passes"] = tuple(args.walrus_passes)
    if "--penguin-passes" in given:
        overrides["penguin_passes"] = tuple(args.penguin_passes)
    if "--num-stages" in given:
        overrides["num_stages"] = args.num_stages
    if "--loops" in given:
        overrides["loops"] = args.loops
    return overrides


def run(args: argparse.Namespace) -> int:
    from ncc.orchestrator.farm import farm

    farm_dir = Path(os.path.abspath(args.farm_dir))
    if args.report is not None and not Path(os.path.abspath(args.report)).parent.is_dir():
        raise NccError.of("U004", f"the directory of the report does not exist: {args.report}")
    cache_dir = Path(os.path.abspath(args.cache_dir)) if args.cache_dir else None
    if cache_dir is not None:
        try:
            StageCache(cache_dir).ensure_usable()
        except CacheError as err:
            raise NccError.of("U009", str(err)) from None
    base = CompileOptions(
        model=Path(),
        output=Path(),
        workdir=Path(),
        optlevel=args.optlevel,
        verify=args.verify,
        walrus_passes=tuple(args.walrus_passes),
        penguin_passes=tuple(args.penguin_passes),
        num_stages=args.num_stages,
        loops=args.loops,
        timeout_s=args.timeout,
        mem_limit_mb=args.mem_limit,
        verbose=args.verbose,
    )
    settings = farm.FarmSettings(
        farm_dir=farm_dir,
        workers=args.workers,
        scheduler_url=args.scheduler_url,
        cache_dir=cache_dir,
        mem_per_job_mb=args.mem_per_job,
        retries=max(0, args.retries),
        base=base,
    )
    if args.mem_per_job and args.mem_per_job > farm.host_memory_mb():
        raise NccError.of(
            "U002",
            f"--mem-per-job {args.mem_per_job} MB is more than this machine has "
            f"({farm.host_memory_mb()} MB): no job could ever start",
        )
    budget_tool_threads(args.workers)
    inputs = farm.collect_inputs(args.inputs)
    for item in inputs:  # a manifest's bad flags are refused before the farm dir is made
        _parse_manifest_flags(item.flags)
    try:  # made only once the request is known good: a refused farm leaves nothing behind
        farm_dir.mkdir(parents=True, exist_ok=True)
        (farm_dir / "neff").mkdir(exist_ok=True)
    except OSError as err:
        raise NccError.of("U003", f"cannot use farm directory {farm_dir}: {err.strerror or err}") from None
    models = farm.plan(inputs, settings, _parse_manifest_flags)

    run_id = f"farm-{os.urandom(6).hex()}"
    cache_mark = StageCache(cache_dir).events_mark() if cache_dir else 0
    luigi_setup.configure_logging(args.verbose, farm_dir / f"farm-{os.getpid()}.log", console=sys.stderr)
    if settings.scheduler_url:  # workers coordinate through luigid
        _run_with_luigi(models, settings, run_id, args.verbose)
        outcomes = farm.outcomes(models, settings, run_id, cache_mark)
    else:  # one farm process per farm dir; what the cache fully holds needs no Luigi at all
        with WorkDir(farm_dir).locked():
            remaining = farm.restore_without_tools(models, run_id)
            if remaining:
                _run_with_luigi(remaining, settings, run_id, args.verbose)
            outcomes = farm.outcomes(models, settings, run_id, cache_mark)
    entries = [entry for outcome in outcomes for entry in outcome.report_entries()]
    if args.report is not None:
        write_json_atomic(Path(os.path.abspath(args.report)), {"models": entries, "farm_dir": str(farm_dir)})
    if args.verbose >= 1:
        print_table(outcomes)
    warn_not_stored(
        [(job.name, job.cache_not_stored) for o in outcomes for job in o.jobs if job.cache_not_stored],
        cache_dir,
    )
    failed = [o for o in outcomes if o.diagnostic is not None]
    if not failed:
        return int(ExitCode.OK)
    return max(int(o.diagnostic.exit_code) for o in failed if o.diagnostic is not None)


def _run_with_luigi(
    models: list[farm_types.FarmModel], settings: farm_types.FarmSettings, run_id: str, verbose: int
) -> None:
    from ncc.orchestrator.farm import farm

    luigi_setup.require_shared_memory()
    luigi_setup.isolate_config()
    farm.configure_luigi(settings)
    from ncc.orchestrator.farm.progress import Progress

    progress = Progress(models, run_id, sys.stderr) if verbose >= 1 else None
    farm.run_farm(models, settings, run_id, progress)


def print_table(outcomes: list[farm_types.ModelOutcome]) -> None:
    rows = []
    for outcome in outcomes:
        restored = sum(1 for job in outcome.jobs if job.cached and job.ran_here)
        reused = sum(1 for job in outcome.jobs if not job.ran_here)
        jobs = len(outcome.model.jobs)
        detail = outcome.diagnostic.line() if outcome.diagnostic else str(outcome.neff)
        for item in outcome.model.inputs:
            rows.append(
                (
                    item.path.name,
                    outcome.status,
                    f"{outcome.wall_s:.2f}",
                    f"{restored}/{jobs}",
                    f"{reused}/{jobs}",
                    detail,
                )
            )
    # restored: from the stage cache by this farm; reused: found complete in the model's work dir
    header = ("model", "status", "wall s", "restored", "reused", "NEFF or diagnostic")
    widths = [max(len(str(r[i])) for r in [header, *rows]) for i in range(5)]
    for row in [header, *rows]:
        print(
            "  ".join(str(cell).ljust(width) for cell, width in zip(row[:5], widths, strict=True))
            + "  "
            + row[5]
        )
    failed = sum(1 for o in outcomes for _ in o.model.inputs if o.status != "ok")
    total = sum(len(o.model.inputs) for o in outcomes)
    lookups = [job.cache_lookup for o in outcomes for job in o.jobs if job.ran_here and job.cache_lookup]
    cache = ""
    if lookups:
        cache = (
            f"; stage cache: {lookups.count('hit')} hits, {lookups.count('miss')} misses, "
            f"{lookups.count('corrupt')} corrupt entries discarded and recomputed"
        )
    print(f"ncc farm: {total - failed} of {total} models compiled, {failed} failed{cache}")
