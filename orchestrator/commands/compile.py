"""`ncc compile MODEL --output FILE.neff`: compile an HLO module into a NEFF.

Parses the flags into CompileOptions (absolute paths, the default work directory beside the
output), hands them to CommandDriver, which runs the compile in a child process, and prints the
outcome: one diagnostic line on failure, one summary line on success (unless --verbose 0).
"""

from __future__ import annotations

import argparse
import os
import re
import sys
from pathlib import Path

from ncc.orchestrator.options import (
    DEFAULT_LOOPS,
    DEFAULT_OPTLEVEL,
    LOOP_MODES,
    OPTLEVELS,
    CompileOptions,
    default_workdir,
)
from ncc.orchestrator.outputs import is_stream
from ncc.tools.common.pipeline_text import split_pipeline

_PASS_NAME = re.compile(r"^[A-Za-z_][A-Za-z0-9_]*$")


def _pass_list(text: str) -> tuple[str, ...]:
    """Split a pass pipeline at top-level commas; `pass{key=value,...}` options stay with their pass.

    The walrus driver owns the meaning of names and options; this only refuses text that is not a
    pipeline at all, so a typo is reported before any job runs only when it is a syntax error.
    """
    try:
        items = split_pipeline(text)
    except ValueError:  # unbalanced braces: the whole text is at fault
        items = [text + " (unbalanced braces)"]
    bad = [item for item in items if not _PASS_NAME.match(item.split("{", 1)[0]) or item.endswith(" braces)")]
    if bad:
        raise argparse.ArgumentTypeError(
            f"{text!r} is not a comma-separated list of pass names (bad: {', '.join(repr(b) for b in bad)})"
        )
    return tuple(items)


def positive_float(text: str) -> float:
    try:
        value = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r} is not a number of seconds") from None
    if not value > 0:
        raise argparse.ArgumentTypeError(f"{text!r} must be greater than 0")
    return value


def _stage_count(text: str) -> int:
    try:
        value = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r} is not a whole number of stages") from None
    if value <= 0:
        raise argparse.ArgumentTypeError(f"{text!r} must be greater than 0")
    return value


def positive_int(text: str) -> int:
    value = non_negative_int(text)
    if value == 0:
        raise argparse.ArgumentTypeError(f"{text!r} must be greater than 0")
    return value


def non_negative_int(text: str) -> int:
    try:
        value = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r} is not a whole number") from None
    if value < 0:
        raise argparse.ArgumentTypeError(f"{text!r} must not be negative")
    return value


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "model", type=Path, help="the HLO module: HloModuleProto (.hlo.pb) or HLO text (.hlo)"
    )
    parser.add_argument(
        "--output", "-o", type=Path, required=True, metavar="FILE.neff", help="the NEFF to write"
    )
    parser.add_argument(
        "--workdir",
        type=Path,
        metavar="DIR",
        help="where jobs keep their intermediates, logs and records; a compile resumes from it "
        "(default: <output stem>.ncc-work beside the output)",
    )
    parser.add_argument(
        "--verify-inputs",
        type=Path,
        metavar="IN.npz",
        help="--verify on these inputs (arg0..argN by parameter number, as `ncc run` takes them) instead "
        "of seeded N(0, 1) ones: for a module whose outputs seeded inputs make meaningless (a long "
        "recurrence that amplifies rounding, a domain that needs positive values); implies --verify",
    )
    add_compile_flags(parser)


def add_result_flags(parser: argparse.ArgumentParser) -> None:
    """The flags that change what a compile produces (a farm's manifest lines may set them too)."""
    parser.add_argument(
        "--optlevel",
        "-O",
        type=int,
        choices=OPTLEVELS,
        default=DEFAULT_OPTLEVEL,
        help="optimization level (default 2): 0 keeps the frontend's instruction order; 1 schedules; "
        "2 also spreads large DMAs over several queues; 3 tries several schedules and keeps the fastest",
    )
    parser.add_argument(
        "--verify",
        action="store_true",
        help="also evaluate the HLO on seeded inputs and check the NEFF's simulated outputs against it",
    )
    parser.add_argument(
        "--walrus-passes", type=_pass_list, default=(), metavar="a,b,...", help="the backend pass list to run"
    )
    parser.add_argument(
        "--penguin-passes",
        type=_pass_list,
        default=(),
        metavar="a,b,...",
        help="the Penguin optimizer's pass list (fusion, cse, act_functions, broadcast_operands, dce, "
        "retile, tile_order, epilogues, pipeline, invariant_loads, forward, direct_copies, act_operands), "
        "'none' for none; default: all, none at -O0",
    )
    parser.add_argument(
        "--num-stages",
        type=_stage_count,
        default=0,
        metavar="N",
        help="software-pipeline every eligible loop in N stages where the pipeline pass runs (loops "
        "annotated with ncc_num_stages keep theirs; a loop it would make wrong is left as it is)",
    )
    parser.add_argument(
        "--loops",
        choices=LOOP_MODES,
        default=DEFAULT_LOOPS,
        help="rolled: a loop nest whose iterations lower alike stays a loop in BIR and the NEFF (but in a "
        "nest of at most 128 instructions, 512 of transfers alone), so the compile costs what the program's "
        "text costs; unrolled: every loop is unrolled; auto: rolled for a "
        f"program that would unroll to 20,000 backend instructions or more (default {DEFAULT_LOOPS}). "
        "Under auto and rolled an HLO while loop stays a loop where its trips would unroll to 20,000 "
        "backend instructions or more",
    )


def add_compile_flags(parser: argparse.ArgumentParser) -> None:
    """Result flags plus how jobs run: limits and the stage cache (shared with `ncc farm`)."""
    add_result_flags(parser)
    parser.add_argument(
        "--timeout", type=positive_float, metavar="S", help="wall-clock limit per job, seconds"
    )
    parser.add_argument(
        "--mem-limit",
        type=positive_int,
        metavar="MB",
        help="resident memory limit per job (whole process tree)",
    )
    parser.add_argument(
        "--cache-dir",
        type=Path,
        metavar="DIR",
        help="stage cache shared by every work dir and farm that names it: a job whose cache key "
        "(tool, version, flags, input digests) is there has its outputs restored, verified, instead of run",
    )
    parser.add_argument(
        "--verbose",
        type=int,
        default=1,
        choices=range(4),
        metavar="LEVEL",
        help="0 errors only, 1 a summary line (default), 2 job progress and Luigi's log, 3 debug",
    )


def options_from_args(args: argparse.Namespace) -> CompileOptions:
    output = Path(os.path.abspath(args.output))
    if args.workdir:
        workdir = Path(os.path.abspath(args.workdir))
    elif is_stream(output):  # --output /dev/null: no work dir in /dev, but in the current directory
        workdir = default_workdir(Path.cwd() / output.name)
    else:
        workdir = default_workdir(output)
    return CompileOptions(
        model=Path(os.path.abspath(args.model)),
        output=output,
        workdir=workdir,
        optlevel=args.optlevel,
        verify=args.verify or args.verify_inputs is not None,
        verify_inputs=Path(os.path.abspath(args.verify_inputs)) if args.verify_inputs else None,
        walrus_passes=tuple(args.walrus_passes),
        penguin_passes=tuple(args.penguin_passes),
        num_stages=args.num_stages,
        loops=args.loops,
        timeout_s=args.timeout,
        mem_limit_mb=args.mem_limit,
        verbose=args.verbose,
        cache_dir=Path(os.path.abspath(args.cache_dir)) if args.cache_dir else None,
    )


def run(args: argparse.Namespace) -> int:
    from ncc.orchestrator.cli import keep_crash_logs_in
    from ncc.orchestrator.pipeline.driver import compile_model

    options = options_from_args(args)
    keep_crash_logs_in(options.workdir)
    outcome = compile_model(options)
    if outcome.diagnostic is not None:
        print(outcome.diagnostic.line(), file=sys.stderr)
    elif options.verbose >= 1 and outcome.summary is not None:
        summary = outcome.summary
        jobs, ran = list(summary["jobs"]), list(summary["jobs_run"])
        cached = list(summary.get("jobs_cached", []))
        restored = f", {len(cached)} restored from the cache" if cached else ""
        print(
            f"ncc: compiled {options.model.name} -> {options.output} in {float(summary['wall_s']):.2f} s "
            f"({len(ran) - len(cached)} of {len(jobs)} jobs run{restored}, {len(jobs) - len(ran)} reused); "
            f"work dir {options.workdir}"
        )
    if outcome.summary is not None:
        not_stored = outcome.summary.get("cache_not_stored", [])
        warn_not_stored([(str(job), str(why)) for job, why in not_stored], options.cache_dir)
    return outcome.exit_code


def warn_not_stored(not_stored: list[tuple[str, str]], cache_dir: Path | None) -> None:
    """One line on stderr when the stage cache could not take jobs' outputs (full, read-only):
    the compile is complete, but the next one that could have reused them runs them again.
    `not_stored`: (job, why) per job."""
    if not_stored:
        jobs = ", ".join(dict.fromkeys(job for job, _ in not_stored))
        reasons = "; ".join(dict.fromkeys(why for _, why in not_stored))
        print(
            f"ncc: warning: the stage cache {cache_dir} did not store {len(not_stored)} job outputs "
            f"({jobs}: {reasons}); nothing is lost but reuse: a later compile will run these jobs again",
            file=sys.stderr,
        )
