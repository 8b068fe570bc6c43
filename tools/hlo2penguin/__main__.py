"""ncc-hlo2penguin (job HLOToTensorizer): read an HLO module, verify it, lower it to Penguin IR.

Writes the verified module as a serialized HloModuleProto (--module-output, what the golden
evaluator reads, whatever the input format was) and the Penguin program (--output).
"""

from __future__ import annotations

import argparse

from ncc.tools.common.protoio import write_proto
from ncc.tools.common.toolmain import exit_now, run_tool


def _body(args: argparse.Namespace) -> None:
    from ncc.tools.common.penguin_budget import check_budget
    from ncc.tools.hlo.hlo_reader import load_module
    from ncc.tools.hlo.hlo_verify import verify_module
    from ncc.tools.hlo2penguin.lower import lower_module

    module = load_module(args.input)
    verify_module(module)
    program = lower_module(module, args.loops)
    # Refuse a module too large to unroll before any later job runs: here by what the Penguin
    # optimizer cannot remove (a 25,000-op chain fuses from 2M to 100k instructions); the Frontend
    # job checks the exact count after its passes, before unrolling. A program whose loops may
    # stay loops (--loops auto or rolled) is counted by the Frontend, as it will be emitted.
    if args.loops == "unrolled":
        check_budget(program, surviving=True)
    if args.module_output:
        write_proto(args.module_output, module)
    write_proto(args.output, program)


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
