"""ncc-hlo2penguin (job HLOToTensorizer): read an HLO module, verify it, lower it to Penguin IR.

Writes the verified module as a serialized HloModuleProto (--module-output, what the golden
evaluator reads, whatever the input format was) and the Penguin program (--output).
"""

from __future__ import annotations

import argparse
import os

from ncc.schemas import hlo_pb2
from ncc.tools.common.errors import CompileError
from ncc.tools.common.protoio import write_proto
from ncc.tools.common.toolmain import exit_now, run_tool


def _body(args: argparse.Namespace) -> None:
    from ncc.tools.common.penguin_budget import check_budget
    from ncc.tools.hlo.hlo_reader import load_module
    from ncc.tools.hlo.hlo_verify import verify_module
    from ncc.tools.hlo2penguin.lower import lower_module

    module = load_module(args.input)
    try:
        verify_module(module)
        program = lower_module(module, args.loops)
        # Refuse a module too large to unroll before any later job runs: here by what the Penguin
        # optimizer cannot remove (a 25,000-op chain fuses from 2M to 100k instructions); the
        # Frontend job checks the exact count after its passes, before unrolling. A program whose
        # loops may stay loops (--loops auto or rolled) is counted by the Frontend, as it will be emitted.
        if args.loops == "unrolled":
            check_budget(program, surviving=True)
    except CompileError as error:
        error.location = with_source(module, error.location)
        raise
    if args.module_output:
        write_proto(args.module_output, module)
    write_proto(args.output, program)


def with_source(module: hlo_pb2.HloModuleProto, location: str) -> str:
    """`location`, where it names an instruction of the module that carries the framework's
    metadata, followed by where the framework made it: JAX's op name (its last 80 characters) and
    source line, so that a diagnostic on `while.26` says it is igamma's loop in the user's file."""
    if not location:
        return location
    for computation in module.computations:
        for instr in computation.instructions:
            if instr.name == location:
                metadata = instr.metadata
                name = metadata.op_name[-80:]
                line = f"{os.path.basename(metadata.source_file)}:{metadata.source_line}" \
                    if metadata.source_file else ""
                origin = " at ".join(part for part in (name, line) if part)
                return f"{location}, from {origin}" if origin else location
    return location


def main() -> None:
    parser = argparse.ArgumentParser(prog="ncc-hlo2penguin", description=__doc__.splitlines()[0])
    parser.add_argument("--input", required=True, help="HloModuleProto (.hlo.pb) or HLO text (.hlo)")
    parser.add_argument("--output", required=True, help="Penguin program to write")
    parser.add_argument("--module-output", help="verified HloModuleProto to write")
    parser.add_argument("--loops", choices=("auto", "rolled", "unrolled"), default="auto",
                        help="the Frontend's --loops: whether a while loop may stay a loop, and only an "
                             "unrolled program is refused here for its size")
    exit_now(run_tool("hlo2penguin", parser, _body))


if __name__ == "__main__":
    main()
