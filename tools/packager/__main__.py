"""`ncc-packager`: package a codegen'd BIR program into a NEFF file.

    ncc-packager --input program.pb --output model.neff [--metadata k=v ...] --diagnostics d.pb

Exit 0 with the NEFF written atomically; exit 1 with a Diagnostic on a CompileError (E1xx the
program could not be read, E503 it cannot be packaged); exit 2 on a bad command line.
"""

from __future__ import annotations

import argparse

from ncc.schemas import bir_pb2
from ncc.tools.common.protoio import read_proto
from ncc.tools.common.toolmain import exit_now, run_tool
from ncc.tools.packager.neff import build_neff, write_neff


def _key_value(text: str) -> tuple[str, str]:
    key, sep, value = text.partition("=")
    if not sep or not key:
        raise argparse.ArgumentTypeError(f"expected KEY=VALUE, got {text!r}")
    return key, value


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="ncc-packager", description="Package a BIR program as a NEFF.")
    parser.add_argument("--input", required=True, help="codegen'd BIR Program (.pb)")
    parser.add_argument("--output", required=True, help="the NEFF file to write")
    parser.add_argument(
        "--metadata",
        type=_key_value,
        nargs="+",
        action="extend",
        default=[],
        metavar="KEY=VALUE",
        help="metadata entries to record in the NEFF (repeatable)",
    )
    return parser


def body(args: argparse.Namespace) -> None:
    program = read_proto(args.input, bir_pb2.Program, "BIR program")
    write_neff(args.output, build_neff(program, dict(args.metadata)))


def main() -> None:
    exit_now(run_tool("packager", build_parser(), body))


if __name__ == "__main__":
    main()
