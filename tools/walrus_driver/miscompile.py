"""Planted miscompiles (test-only): make a pass's output wrong on purpose, in one known place.

`NCC_FAULT_INJECT=walrus_driver:KIND@pass=NAME` (ncc.tools.common.faults) asks the pass manager
to call `plant(program, KIND)` right after pass NAME ran, so that tests of `ncc bisect` and
`--verify` have a miscompile whose pass and instruction they know:

  drop_wait   the first instruction in program order that waits on a semaphore loses its first
              wait: it may now run before the producer it waited for (the simulator's race
              detector reports the pair; birverifier, if it runs later, too)
  drop_rotation_wait
              in rolled streams (after roll_loops), the first loop body instruction that writes
              a rotating on-chip address (a buffer of N that iterations take in turn) loses its
              first wait whose threshold grows with the loop, in every iteration: iteration i's
              write may now overtake the instruction of an earlier iteration it waited for
              (the simulator reports the race between the two, iterations named `name@i`)
  max_to_add  the first ALU instruction (tensor_tensor, tensor_scalar, tensor_reduce) in program
              order whose func is `maximum` computes `add` instead

The change is made to the global instruction list and, once codegen has filled them, to the
same instruction in the per-engine streams. `plant` says what it changed ("" when the program
holds nothing to change: no waits before alloc_semaphores, no maximum in the module).
"""

from __future__ import annotations

from collections.abc import Iterator

from ncc.schemas import bir_pb2
from ncc.tools.walrus_driver import printer

_ALU_OPS = frozenset({"tensor_tensor", "tensor_scalar", "tensor_reduce"})


def _copies(program: bir_pb2.Program, instr_id: int) -> Iterator[bir_pb2.Instruction]:
    """Every copy of instruction `instr_id`: in the global list and in the streams."""
    for instr in program.instructions:
        if instr.id == instr_id:
            yield instr
    for stream in program.streams:
        for instr in stream.instructions:
            if instr.id == instr_id:
                yield instr


def _first(program: bir_pb2.Program, wanted) -> bir_pb2.Instruction | None:
    return next((instr for instr in program.instructions if wanted(instr)), None)


def drop_wait(program: bir_pb2.Program) -> str:
    victim = _first(program, lambda instr: len(instr.waits) > 0)
    if victim is None:
        return ""
    wait = victim.waits[0]
    change = f"dropped wait(s{wait.semaphore}>={wait.value}) of {printer.format_instruction(victim)}"
    for copy in _copies(program, victim.id):
        for index, other in enumerate(copy.waits):
            if (other.semaphore, other.value) == (wait.semaphore, wait.value):
                del copy.waits[index]
                break
    return change


def drop_rotation_wait(program: bir_pb2.Program) -> str:
    for stream in program.streams:
        for instr in stream.instructions:
            rotating = any(any(v.rotation for v in ap.loop) for ap in instr.outputs)
            grown = [k for k, wait in enumerate(instr.waits) if any(wait.loop_steps)]
            if rotating and grown:
                wait = instr.waits[grown[0]]
                change = (
                    f"dropped rotation wait(s{wait.semaphore}>={wait.value}"
                    f"+{list(wait.loop_steps)}/iteration) "
                    f"of loop body instruction {printer.format_instruction(instr)}"
                )
                del instr.waits[grown[0]]
                return change
    return ""


def max_to_add(program: bir_pb2.Program) -> str:
    victim = _first(program, lambda instr: instr.op in _ALU_OPS and instr.func == "maximum")
    if victim is None:
        return ""
    change = f"maximum -> add in {printer.format_instruction(victim)}"
    for copy in _copies(program, victim.id):
        copy.func = "add"
    return change


PLANTERS = {"drop_wait": drop_wait, "drop_rotation_wait": drop_rotation_wait, "max_to_add": max_to_add}


def plant(program: bir_pb2.Program, kind: str) -> str:
    """Plant miscompile `kind` in `program`; what was changed, or "" if nothing could be."""
    return PLANTERS[kind](program)
