"""Small hand-built BIR programs for the walrus_driver pass tests, in the frontend's output form.

Buffers are virtual (address -1), dmas are on SP queue 0, there are no waits: exactly what the
frontend hands the backend. `Bir` declares tensors and buffers and appends instructions in one
global order; the helpers cover 2-D tiles ([partitions, cols] on chip, [rows, cols] in HBM).
"""

from __future__ import annotations

import numpy as np
from sim_builders import ProgramBuilder, hbm_2d, onchip

from ncc.schemas import bir_pb2, common_pb2
from ncc.tools.target import load_target
from ncc.tools.walrus_driver.context import PassContext
from ncc.tools.walrus_driver.pass_manager import PassManager

F32, BF16, S32 = common_pb2.F32, common_pb2.BF16, common_pb2.S32
SBUF, PSUM, HBM = common_pb2.SBUF, common_pb2.PSUM, common_pb2.HBM
PE, ACT, POOL, DVE, SP = common_pb2.PE, common_pb2.ACT, common_pb2.POOL, common_pb2.DVE, common_pb2.SP


def hbm_ap(
    tensor: str, rows: int, cols: int, row0: int = 0, dtype: int = F32, row_stride: int | None = None
) -> bir_pb2.AccessPattern:
    return hbm_2d(tensor, rows, cols, dtype=dtype, row0=row0, row_stride=row_stride)


def tile(
    buffer: str,
    partitions: int,
    cols: int,
    offset: int = 0,
    dtype: int = F32,
    memory: int = SBUF,
    partition_start: int = 0,
) -> bir_pb2.AccessPattern:
    return onchip(
        buffer, partitions, cols, dtype=dtype, memory=memory, offset=offset, partition_start=partition_start
    )


class Bir(ProgramBuilder):
    """Accumulates a frontend-style BIR program: virtual buffers (address -1), no semaphores."""

    def __init__(self, name: str = "t") -> None:
        super().__init__(name, num_semaphores=0)

    def buffer(self, name: str, bytes_per_partition: int, memory: int = SBUF, partitions: int = 128) -> str:
        return super().buffer(name, bytes_per_partition, memory, partitions, address=-1)

    # ---- common instructions on [p, cols] f32 tiles ----------------------------------------
    def load(
        self, buf: str, tensor: str, p: int, cols: int, row0: int = 0, name: str | None = None
    ) -> bir_pb2.Instruction:
        return self.add("dma", SP, [tile(buf, p, cols)], [hbm_ap(tensor, p, cols, row0)], name=name)

    def store(
        self, tensor: str, buf: str, p: int, cols: int, row0: int = 0, name: str | None = None
    ) -> bir_pb2.Instruction:
        return self.add("dma", SP, [hbm_ap(tensor, p, cols, row0)], [tile(buf, p, cols)], name=name)

    def tt(
        self,
        out: str,
        a: str,
        b: str,
        p: int,
        cols: int,
        func: str = "add",
        engine: int = DVE,
        name: str | None = None,
    ) -> bir_pb2.Instruction:
        return self.add(
            "tensor_tensor",
            engine,
            [tile(out, p, cols)],
            [tile(a, p, cols), tile(b, p, cols)],
            func=func,
            name=name,
        )

    def act(
        self,
        out: str,
        a: str,
        p: int,
        cols: int,
        func: str = "exp",
        name: str | None = None,
        out_memory: int = SBUF,
        in_memory: int = SBUF,
    ) -> bir_pb2.Instruction:
        return self.add(
            "activation",
            ACT,
            [tile(out, p, cols, memory=out_memory)],
            [tile(a, p, cols, memory=in_memory)],
            func=func,
            scalars=[1.0, 0.0],
            name=name,
        )

    def ts(
        self,
        out: str,
        a: str,
        p: int,
        cols: int,
        scalar: float = 2.0,
        func: str = "multiply",
        engine: int = DVE,
        name: str | None = None,
    ) -> bir_pb2.Instruction:
        return self.add(
            "tensor_scalar",
            engine,
            [tile(out, p, cols)],
            [tile(a, p, cols)],
            func=func,
            scalars=[scalar],
            name=name,
        )

    def matmul(
        self,
        out: str,
        stationary: str,
        moving: str,
        k: int,
        m: int,
        n: int,
        accumulate: bool = False,
        name: str | None = None,
    ) -> bir_pb2.Instruction:
        return self.add(
            "matmul",
            PE,
            [tile(out, m, n, memory=PSUM)],
            [tile(stationary, k, m), tile(moving, k, n)],
            accumulate=accumulate,
            name=name,
        )


def run_passes(program: bir_pb2.Program, passes: str, verify_each: bool = True) -> PassContext:
    """Run a pipeline over `program` in place (verifier after every pass, as MLIR tests do)."""
    from ncc.tools.walrus_driver.pass_manager import Instruments

    ctx = PassContext.for_program(program, load_target("trn1"))
    PassManager(passes, Instruments(verify_each=verify_each)).run(ctx)
    return ctx


def chain_program(tiles: int = 2, cols: int = 64) -> bir_pb2.Program:
    """Per tile: load x, load y -> DVE add -> ACT exp -> store; each tile with fresh buffers."""
    b = Bir("chain")
    b.hbm("x", [128 * tiles, cols], index=0)
    b.hbm("y", [128 * tiles, cols], index=1)
    b.hbm("out", [128 * tiles, cols], role=bir_pb2.OUTPUT, index=0)
    for t in range(tiles):
        for name in ("x", "y", "s", "e"):
            b.buffer(f"{name}{t}", cols * 4)
        b.load(f"x{t}", "x", 128, cols, row0=128 * t, name=f"load_x{t}")
        b.load(f"y{t}", "y", 128, cols, row0=128 * t, name=f"load_y{t}")
        b.tt(f"s{t}", f"x{t}", f"y{t}", 128, cols, name=f"add{t}")
        b.act(f"e{t}", f"s{t}", 128, cols, name=f"exp{t}")
        b.store("out", f"e{t}", 128, cols, row0=128 * t, name=f"store{t}")
    return b.build()


def reference_chain(inputs: dict[str, np.ndarray]) -> np.ndarray:
    return np.exp(inputs["arg0"] + inputs["arg1"]).astype(np.float32)


def by_name(program: bir_pb2.Program) -> dict[str, bir_pb2.Instruction]:
    return {instr.name: instr for instr in program.instructions}


def random_program(seed: int, steps: int = 40, cols: int = 64) -> bir_pb2.Program:
    """A random but well-defined program: loads, stores (also through an HBM scratch tensor that is
    read back), DVE/ACT/POOL elementwise work, matmuls into PSUM, buffer reuse (WAR/WAW) and half-
    partition accesses. Only fully written buffers are read, so the result is defined."""
    rng = np.random.default_rng(seed)
    b = Bir(f"random{seed}")
    rows = 256
    b.hbm("x", [rows, cols], index=0)
    b.hbm("w", [128, cols], index=1)
    b.hbm("out", [rows, cols], role=bir_pb2.OUTPUT, index=0)
    b.hbm("scratch", [rows, cols], role=bir_pb2.INTERNAL)
    written: list[str] = []  # SBUF buffers fully written, [128, cols] f32
    scratch_rows: list[int] = []
    counter = 0

    def fresh(memory: int = SBUF) -> str:
        nonlocal counter
        counter += 1
        return b.buffer(f"{'p' if memory == PSUM else 'b'}{counter}", cols * 4, memory=memory)

    def target_buffer() -> str:
        if written and rng.random() < 0.3:
            return written[int(rng.integers(len(written)))]  # overwrite: WAR/WAW on a live name
        return fresh()

    def mark(name: str) -> None:
        if name not in written:
            written.append(name)

    for step in range(steps):
        choice = rng.random()
        if choice < 0.2 or len(written) < 2:
            out = target_buffer()
            if scratch_rows and rng.random() < 0.4:
                row0 = scratch_rows[int(rng.integers(len(scratch_rows)))]
                b.load(out, "scratch", 128, cols, row0=row0, name=f"s{step}_reload")
            else:
                b.load(out, "x", 128, cols, row0=128 * int(rng.integers(2)), name=f"s{step}_load")
            mark(out)
        elif choice < 0.4:
            a, c = (written[int(i)] for i in rng.integers(len(written), size=2))
            out = target_buffer()
            half = rng.random() < 0.3 and out in written
            if half:  # only partitions 64..128 change: out must already be fully written
                start = 64
                b.add(
                    "tensor_tensor",
                    DVE,
                    [tile(out, 64, cols, partition_start=start)],
                    [tile(a, 64, cols, partition_start=start), tile(c, 64, cols, partition_start=start)],
                    func="add",
                    name=f"s{step}_halfadd",
                )
            else:
                engine = DVE if rng.random() < 0.7 else POOL
                b.tt(
                    out,
                    a,
                    c,
                    128,
                    cols,
                    func=["add", "maximum", "subtract"][int(rng.integers(3))],
                    engine=engine,
                    name=f"s{step}_tt",
                )
            mark(out)
        elif choice < 0.55:
            a = written[int(rng.integers(len(written)))]
            out = target_buffer()
            b.act(
                out,
                a,
                128,
                cols,
                func=["tanh", "identity", "relu"][int(rng.integers(3))],
                name=f"s{step}_act",
            )
            mark(out)
        elif choice < 0.65:
            a = written[int(rng.integers(len(written)))]
            out = target_buffer()
            b.ts(
                out, a, 128, cols, scalar=0.5, engine=POOL if rng.random() < 0.5 else DVE, name=f"s{step}_ts"
            )
            mark(out)
        elif choice < 0.8:
            stationary, moving = (written[int(i)] for i in rng.integers(len(written), size=2))
            psum = fresh(PSUM)
            b.matmul(psum, stationary, moving, 128, cols, cols, name=f"s{step}_mm")
            if rng.random() < 0.5:
                b.matmul(psum, moving, stationary, 128, cols, cols, accumulate=True, name=f"s{step}_mmacc")
            out = target_buffer()
            if out in written:  # the copy writes only `cols` partitions, so use a fresh buffer
                out = fresh()
            b.add(
                "tensor_copy",
                ACT if rng.random() < 0.5 else DVE,
                [tile(out, cols, cols)],
                [tile(psum, cols, cols, memory=PSUM)],
                name=f"s{step}_evict",
            )
            b.add(
                "tensor_copy",
                DVE,
                [tile(out, 128 - cols, cols, partition_start=cols)],
                [tile(written[0], 128 - cols, cols, partition_start=cols)],
                name=f"s{step}_fill",
            )
            mark(out)
        else:
            a = written[int(rng.integers(len(written)))]
            if rng.random() < 0.4:
                row0 = 128 * int(rng.integers(2))
                b.store("scratch", a, 128, cols, row0=row0, name=f"s{step}_spill")
                if row0 not in scratch_rows:
                    scratch_rows.append(row0)
            else:
                b.store("out", a, 128, cols, row0=128 * int(rng.integers(2)), name=f"s{step}_store")
    for index, name in enumerate(written[-2:]):
        b.store("out", name, 128, cols, row0=128 * index, name=f"final_store{index}")
    return b.build()


def loop_beside_a_held_tile(tiles: int = 4, cols: int = 5120, held_cols: int = 24576) -> bir_pb2.Program:
    """A loop body of `tiles` independent load -> exp (the first: + held) -> store chains on
    [128, cols] f32 tiles (private to the loop), and a [128, held_cols] tile loaded before the
    loop, read in it and after it."""
    b = Bir()
    b.hbm("x", [128, held_cols])
    b.hbm("y", [128, cols])
    b.hbm("out", [128, held_cols], role=bir_pb2.OUTPUT)
    b.buffer("held", held_cols * 4)
    b.load("held", "x", 128, held_cols, name="held.load")
    body = []
    for t in range(tiles):
        b.hbm(f"z{t}", [128, cols], role=bir_pb2.OUTPUT, index=t + 1)
        b.buffer(f"a{t}", cols * 4)
        b.buffer(f"o{t}", cols * 4)
        body.append(b.load(f"a{t}", "y", 128, cols, name=f"load{t}"))
        if t == 0:  # the loop reads the held tile: it is live over the whole body, never spilled
            body.append(b.tt(f"o{t}", f"a{t}", "held", 128, cols, name=f"add{t}"))
        else:
            body.append(b.act(f"o{t}", f"a{t}", 128, cols, name=f"exp{t}"))
        body.append(b.store(f"z{t}", f"o{t}", 128, cols, name=f"store{t}"))
    b.ts("held", "held", 128, held_cols, name="held.scale")
    b.store("out", "held", 128, held_cols, name="held.store")
    program = b.build()
    loop_id = max(instr.id for instr in program.instructions) + 1
    entry = bir_pb2.Instruction(id=loop_id, op="loop", engine=SP, trip_count=2, body_length=len(body),
                                name="L")
    instructions = list(program.instructions)
    first = next(index for index, instr in enumerate(instructions) if instr.id == body[0].id)
    for instr in instructions[first:first + len(body)]:
        instr.in_loop = loop_id
    del program.instructions[:]
    program.instructions.extend([*instructions[:first], entry, *instructions[first:]])
    for buffer in program.buffers:
        if buffer.name[0] in "ao":
            buffer.private_to = loop_id
    return program
