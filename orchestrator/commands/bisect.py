"""`ncc bisect WORKDIR [--linear] [--json] [--timeout S]`: the pass that miscompiled.

Finds the first pass of a work dir's compile — a Frontend (Penguin) pass or a walrus pass — after
which the program, simulated on the golden inputs, stops matching the golden outputs (or races,
deadlocks, or is rejected by birverifier), and prints that pass, what goes wrong after it, and the
BIR around the first instruction whose result differs. Probes run the stage tools in
WORKDIR/bisect/; the work is in ncc.orchestrator.bisect.

Exit 0 when every state matches (nothing to find), 5 when a pass was found (or the program
differs before any pass), a U-code for bad input.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

from ncc.orchestrator import stop_like_ctrl_c
from ncc.orchestrator.commands.compile import positive_float
from ncc.orchestrator.diagnostics import ExitCode, one_line, printable
from ncc.orchestrator.triage.bisect import Bisection, Probe, bisect, environment_warnings, replay_line


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("workdir", type=Path, metavar="WORKDIR", help="a compile's work dir (--workdir)")
    parser.add_argument(
        "--linear",
        action="store_true",
        help="check the states in order and stop at the first that differs (default: binary search)",
    )
    parser.add_argument("--json", action="store_true", help="print one JSON object instead of text")
    parser.add_argument(
        "--timeout", type=positive_float, metavar="S", help="kill any one tool run after S seconds"
    )


_SHORT = 150  # characters of a probe's message shown on its progress line


def _short(text: str) -> str:
    text = one_line(text)
    return text if len(text) <= _SHORT else text[: _SHORT - 3] + "..."


def _probe_line(result: Bisection, probe: Probe) -> str:
    state = f"state {probe.state:>2} {result.describe_state(probe.state)}"
    verdict = probe.verdict if probe.matches else f"{probe.verdict}: [{probe.code}] {_short(probe.message)}"
    return f"  {state:<64}  {verdict}"


def _header(result: Bisection) -> str:
    jobs: dict[str, list[str]] = {}
    for step in result.steps:
        jobs.setdefault(step.job, []).append(step.label)
    passes = "; ".join(f"{job} {', '.join(labels)}" for job, labels in jobs.items())
    return f"ncc bisect: {result.workdir}: {len(result.steps)} passes ({passes}), golden {result.golden}"


_WHY = {
    "value": "its result differs from the one it had before the pass",
    "race": "it races: the first race the simulator found, its other instruction marked *",
    "text": "the first instruction the pass changed",
}


def render(result: Bisection) -> str:
    if result.baseline_differs:
        first = result.probe(0)
        assert first is not None
        lines = [
            "ncc bisect: the program differs before any pass: the lowering (hlo2penguin) or the "
            "Frontend's BIR codegen made it, not a pass",
            f"  {first.verdict}: [{first.code}] {one_line(first.message)}",
            f"  replay: {replay_line(result, first)}",
        ]
        return "\n".join(printable(line) for line in lines)
    if result.culprit is None:
        lines = [
            f"ncc bisect: nothing differs: the program matches the golden outputs after each of the "
            f"{len(result.steps)} passes"
        ]
        if result.verify_failed:
            lines.append(
                "  (the compile's --verify failed: what differs comes after the passes, in the "
                "Packager or the NEFF)"
            )
        return "\n".join(lines)
    step = result.steps[result.culprit - 1]
    after = result.probe(result.culprit)
    assert after is not None
    lines = [
        f"ncc bisect: the result stops matching after pass {step.label} ({step.job} pass {step.position} of "
        f"{step.total}; pass {result.culprit} of {len(result.steps)} in all)",
        f"  before it: matches, state {result.culprit - 1}: {result.describe_state(result.culprit - 1)}",
        f"  after it:  {after.verdict}: [{after.code}] {one_line(after.message)}",
    ]
    difference = result.difference
    if difference is not None:
        lines += [f"  first differing instruction ({_WHY[difference.how]}):", f"    {difference.instruction}"]
        if difference.before and difference.how != "race":
            lines += ["  before the pass it read:", f"    {difference.before}"]
        lines.append(f"  BIR after {step.label} around it:")
        lines += [f"    {line}" for line in difference.context]
    lines.append(f"  replay: {replay_line(result, after)}")
    return "\n".join(printable(line) for line in lines)


def run(args: argparse.Namespace) -> int:
    stop_like_ctrl_c()

    def progress(result: Bisection, probe: Probe) -> None:
        if len(result.probes) == 1:
            print(printable(_header(result)))
        print(printable(_probe_line(result, probe)), flush=True)

    for warning in environment_warnings(args.workdir):
        print(f"ncc: warning: {printable(warning)}", file=sys.stderr)
    result = bisect(
        args.workdir, linear=args.linear, timeout_s=args.timeout, progress=None if args.json else progress
    )
    if args.json:
        print(json.dumps(result.to_json(), indent=1, sort_keys=True))
    else:
        print(render(result))
    sys.stdout.flush()
    return int(ExitCode.CHECK_FAILED if result.found else ExitCode.OK)
