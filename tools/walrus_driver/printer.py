"""A readable text form of a BIR program, for --print-ir-after and test failure messages.

program NAME target=trn1 semaphores=3
  hbm  x f32[128,64] INPUT#0
  buf  sb_x SBUF 128p x 256B @0
  %3 add DVE tensor_tensor add  sb_y[0:128]+0{1x64} <- sb_x[0:128]+0{1x64}, ...  wait(s0>=2) upd(s1+=1)
"""

from __future__ import annotations

from ncc.schemas import bir_pb2
from ncc.tools.common import dtypes
from ncc.tools.target import is_dma
from ncc.tools.walrus_driver.analysis import birutil


def format_ap(ap: bir_pb2.AccessPattern) -> str:
    dims = ",".join(f"{d.stride}x{d.count}" for d in ap.dims)
    where = (
        f"[{ap.partition_start}:{ap.partition_start + ap.partition_count}]"
        if ap.memory in birutil.ONCHIP
        else ""
    )
    varies = "".join(
        f"+rot{list(v.rotation)}+{v.step}/{len(v.rotation)}i" if v.rotation else f"+{v.step}i"
        for v in ap.loop
    )
    return f"{ap.tensor}{where}+{ap.offset}{varies}{{{dims}}}:{dtypes.name(ap.dtype)}"


def format_instruction(instr: bir_pb2.Instruction) -> str:
    engine = birutil.engine_name(instr.engine)
    if is_dma(instr.op):
        engine += f"/q{instr.dma_queue}"
    text = f"%{instr.id} {instr.name} {engine} {instr.op}"
    if instr.op == "loop":
        return text + f" x{instr.trip_count} {{{instr.body_length} entries}}"
    if instr.func:
        text += f" {instr.func}"
    if instr.accumulate:
        text += " acc"
    if instr.scalars:
        text += " scalars=" + ",".join(f"{s:g}" for s in instr.scalars)
    if instr.outputs or instr.inputs:
        text += (
            "  " + ", ".join(map(format_ap, instr.outputs)) + " <- " + ", ".join(map(format_ap, instr.inputs))
        )
    for wait in instr.waits:
        grows = f"+{list(wait.loop_steps)}i" if wait.loop_steps else ""
        text += f"  wait(s{wait.semaphore}>={wait.value}{grows})"
    for update in instr.updates:
        text += f"  upd(s{update.semaphore}+={update.increment})"
    return text


def format_program(program: bir_pb2.Program) -> str:
    lines = [f"program {program.name} target={program.target} semaphores={program.num_semaphores}"]
    for tensor in program.hbm:
        role = bir_pb2.TensorRole.Name(tensor.role)
        shape = ",".join(map(str, tensor.shape))
        lines.append(f"  hbm  {tensor.name} {dtypes.name(tensor.dtype)}[{shape}] {role}#{tensor.index}")
    for buffer in program.buffers:
        where = f"@{buffer.address}" if buffer.address >= 0 else "@?"
        lines.append(
            f"  buf  {buffer.name} {birutil.memory_name(buffer.memory)} "
            f"{buffer.partitions}p x {buffer.bytes_per_partition}B {where}"
        )
    if program.streams:
        for stream in program.streams:
            lines.append(f"  stream {birutil.engine_name(stream.engine)} ({len(stream.instructions)})")
            lines.extend(f"    {format_instruction(i)}" for i in stream.instructions)
    else:
        lines.extend(f"  {format_instruction(i)}" for i in program.instructions)
    return "\n".join(lines) + "\n"
