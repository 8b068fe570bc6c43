"""`ncc triage WORKDIR|FARMDIR [--json] [--bundle OUT.tar.gz]`: explain failed compiles.

For each failed compile: the job, the F-code or the tool's diagnostic, the signal, peak RSS
against --mem-limit, wall time against --timeout, the pass that was running, the last lines of
the job's log and the exact replay command. Over a farm (or any folder of work dirs) failures are
bucketed by signature, largest bucket first, one representative shown in full. `--bundle` packs
a work dir's failed job into a self-contained reproducer (ncc.orchestrator.triage.bundle).
Exit 0 when the triage itself worked, whether or not it found failures; bad input is a U-code.
The work is in ncc.orchestrator.triage.
"""

from __future__ import annotations

import argparse
import json
import shlex
import sys
from pathlib import Path

from ncc.orchestrator.diagnostics import NccError, printable
from ncc.orchestrator.pipeline.process_end import KILLED_FOR_MEMORY, KILLED_FOR_TIMEOUT
from ncc.orchestrator.triage.explain import Bucket, Failure, Triage, triage


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "path", type=Path, metavar="WORKDIR|FARMDIR", help="a compile's work dir, or a farm dir (--farm-dir)"
    )
    parser.add_argument("--json", action="store_true", help="print one JSON object: failures and buckets")
    parser.add_argument(
        "--bundle",
        type=Path,
        metavar="OUT.tar.gz",
        help="write a self-contained reproducer of the work dir's failed job (replay.sh inside)",
    )


def _memory(failure: Failure) -> str:
    if failure.peak_rss_mb is None:
        return "-"
    text = f"peak RSS {failure.peak_rss_mb:.0f} MB"
    if failure.mem_limit_mb is not None:
        share = 100 * failure.peak_rss_mb / failure.mem_limit_mb
        text += f" of a {failure.mem_limit_mb} MB --mem-limit ({share:.0f}%)"
    elif failure.limits_known:
        text += " (no --mem-limit)"
    else:
        text += " (--mem-limit not recorded)"
    if failure.killed_for == KILLED_FOR_MEMORY:
        text += ": killed by ncc for exceeding --mem-limit"
    return text


def _time(failure: Failure) -> str:
    if failure.wall_s is None:
        return "-"
    text = f"wall {failure.wall_s:.1f} s"
    if failure.timeout_s is not None:
        text += f" of a {failure.timeout_s:g} s --timeout"
    elif failure.limits_known:
        text += " (no --timeout)"
    else:
        text += " (--timeout not recorded)"
    if failure.killed_for == KILLED_FOR_TIMEOUT:
        text += ": killed by ncc for exceeding --timeout"
    return text


def _ended(failure: Failure) -> str:
    if failure.signal:
        status = f" (exit status {failure.exit_code})" if failure.exit_code is not None else ""
        return failure.signal + status
    if failure.exit_code is not None:
        return f"exit status {failure.exit_code}"
    return "-"


def describe(failure: Failure, indent: str = "  ") -> list[str]:
    """A failure in full, as lines."""
    rows = [
        ("model", failure.model or "-"),
        ("work dir", str(failure.workdir)),
        ("job", failure.job),
        ("diagnostic", failure.message),
        ("ended", _ended(failure)),
        ("pass", f"{failure.pass_label} ({failure.pass_position})" if failure.pass_label else "-"),
        ("memory", _memory(failure)),
        ("time", _time(failure)),
    ]
    if failure.frames:
        exception = f" ({failure.exception})" if failure.exception else ""
        rows.append(("stack", " < ".join(failure.frames[:6]) + exception))
    rows.append(("replay", failure.replay or "-"))
    lines = [f"{indent}{name:<10}  {printable(value)}" for name, value in rows]
    if failure.killed_for:
        lines.append(
            f"{indent}{'':<10}  (ncc killed the job at a limit; `--bundle` makes a replay.sh that applies it)"
        )
    if failure.log is not None:
        shown = len(failure.last_lines)
        tail = f", last {shown} lines:" if shown else " (empty)"
        lines.append(f"{indent}{'log':<10}  {failure.log}{tail}")
        lines += [f"{indent}  | {printable(line)}" for line in failure.last_lines]
    return lines


def render(result: Triage) -> str:
    lines: list[str] = []
    failed = len(result.failures)
    if result.kind == "workdir":
        if not failed and result.damaged:
            return (
                f"ncc triage: {result.path}: the record of a job cannot be read ({result.damaged[0]}), so "
                "whether the compile finished is unknown; `ncc compile` on this work dir recomputes the job"
            )
        if not failed:
            state = "did not finish, and left no failure" if result.unfinished else "has no failed job"
            return f"ncc triage: {result.path}: the compile {state}"
        lines.append(f"ncc triage: {result.path}: the compile failed")
        lines += describe(result.failures[0])
        return "\n".join(lines)
    buckets: list[Bucket] = result.buckets
    unfinished = f", {len(result.unfinished)} unfinished without a failure" if result.unfinished else ""
    lines.append(
        f"ncc triage: farm {result.path}: {result.compiles} compiles, {failed} failed{unfinished}"
        + (f", {len(buckets)} bucket{'s' if len(buckets) != 1 else ''} by signature" if failed else "")
    )
    for number, bucket in enumerate(buckets, 1):
        members = ", ".join(member.model_name for member in bucket.members)
        lines += [
            "",
            f"bucket {number}: {len(bucket.members)} failure{'s' if len(bucket.members) != 1 else ''}  "
            f"{printable(bucket.signature)}",
            f"  models: {printable(members)}",
            "  representative:",
            *describe(bucket.representative, indent="    "),
        ]
    for path in result.unfinished:
        lines.append(f"unfinished: {path}")
    for path in result.damaged:
        lines.append(f"unreadable job record: {path}")
    return "\n".join(lines)


def run(args: argparse.Namespace) -> int:
    result = triage(args.path)
    if args.bundle is not None:
        from ncc.orchestrator.triage.bundle import write_bundle

        if result.kind != "workdir":
            examples = ", ".join(str(bucket.representative.workdir) for bucket in result.buckets[:3])
            hint = f"; representatives: {examples}" if examples else ""
            raise NccError.of("U002", f"--bundle takes one work dir, not a farm ({result.path}){hint}")
        if not result.failures:
            raise NccError.of("U015", f"{result.path} has no failed job to bundle")
        bundle = write_bundle(result.failures[0], args.bundle)
        for warning in bundle.warnings:
            print(f"ncc: warning: {warning}", file=sys.stderr)
        if not args.json:
            print(render(result))
            print(
                f"ncc triage: wrote {bundle.path} ({bundle.files} files, {bundle.bytes / 1e6:.2f} MB); "
                f"replay: tar xzf {shlex.quote(bundle.path.name)} && "
                f"sh {shlex.quote(f'{bundle.folder}/replay.sh')}"
            )
            return 0
    if args.json:
        data = result.to_json()
        if args.bundle is not None:
            data["bundle"] = str(Path(args.bundle).absolute())
        print(json.dumps(data, indent=1, sort_keys=True))
    else:
        print(render(result))
    return 0
