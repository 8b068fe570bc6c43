"""A rolled NEFF of any executed size: the simulator benchmark's and the fast path's tests' input.

Compiling a program that executes a million instructions takes minutes today (every walrus pass
sees it unrolled), so `pipeline_neff` writes the rolled NEFF directly, as the compiler will once
loops come from the front end: one pass of a pipelined kernel over TILES row tiles of x, repeated
PASSES times (a loop nest of PASSES x TILES iterations on every engine), each tile

    SP   dma     x[i] (HBM, queue 0)          -> xs[g % R]  (SBUF)         ldx
    ACT  dma     acc[i] (HBM out, queue 1)    -> as[g % R]                 lda
    PE   matmul  w^T . xs[g % R]              -> ps[g % P]  (PSUM)         mm
    ACT  act     tanh(ps[g % P])              -> hs[g % R]  (bf16)         act
    DVE  drain   (waits until store g - R freed os[g % R])                 free
    DVE  add     hs + as                      -> os[g % R]                 add
    POOL drain   (waits for add g: POOL must not hold the SBUF port while  ready
                 it waits for DVE, which needs that port)
    POOL scale   os * 0.5                     -> os[g % R]  (in place)     scale
    SP   dma     os[g % R]                    -> out[i] (HBM, queue 2)     st

with g = pass * TILES + i. So out = 0.5 (tanh(w^T x) + out) after each pass. On-chip operands are
absolute `@SBUF`/`@PSUM` addresses that rotate over R (P) slots, HBM offsets step with i, and each
wait's threshold grows per iteration (`loop_steps` [TILES, 1]); the slot-free waits start from
credits that a prologue nop grants (R, P or TILES), so every threshold is at least 0. An epilogue
on SP waits for every semaphore's final count and resets them. Executed instructions:
9 * PASSES * TILES + 10. `drop` names instructions ("lda", "free", ...) whose waits are
dropped: e.g. "free" lets DVE overwrite os[g % R] while store g - R may still read it, a race
between iterations; "mm" (PE no longer waits for x, nor for its PSUM slot) also races.

    python bench/sim_gen.py --executed 1000000 -o big.neff   # also writes big.io.npz (arg0, arg1)
"""

from __future__ import annotations

import argparse
import sys
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parents[1]
if str(ROOT) not in sys.path:  # run as a script from a checkout without the package installed
    sys.path.insert(0, str(ROOT))

from ncc.schemas import bir_pb2, common_pb2  # noqa: E402
from ncc.tools.common import dtypes  # noqa: E402
from ncc.tools.packager.neff import FORMAT_VERSION, MAGIC, write_neff  # noqa: E402
from ncc.tools.target import wait_words  # noqa: E402

F32, BF16 = common_pb2.F32, common_pb2.BF16
SBUF, PSUM, HBM = common_pb2.SBUF, common_pb2.PSUM, common_pb2.HBM
PE, ACT, POOL, DVE, SP = common_pb2.PE, common_pb2.ACT, common_pb2.POOL, common_pb2.DVE, common_pb2.SP
PARTITIONS = 128
PER_ITERATION = 9  # instructions one tile executes
FIXED = 10  # prologue (5) and epilogue (5) instructions
# semaphores
S_W, S_LDX, S_LDA, S_MM, S_ACT, S_DVE, S_POOL, S_ST = range(8)


@dataclass(frozen=True)
class Shape:
    """The kernel's sizes: TILES row tiles of FREE f32 columns, R SBUF and P PSUM slots."""

    passes: int
    tiles: int = 64
    free: int = 64
    rotation: int = 4
    psum_rotation: int = 2

    @property
    def executed(self) -> int:
        return PER_ITERATION * self.passes * self.tiles + FIXED


def shape_for(executed: int, tiles: int = 64, free: int = 64) -> Shape:
    """The shape whose NEFF executes about `executed` instructions (whole passes, at least one)."""
    return Shape(passes=max(1, round((executed - FIXED) / (PER_ITERATION * tiles))), tiles=tiles, free=free)


class _Streams:
    """Per-engine entry lists; `loop_nest` wraps a body in the PASSES x TILES nest."""

    def __init__(self, shape: Shape, drop: Sequence[str]) -> None:
        self.shape = shape
        self.drop = set(drop)
        self.entries: dict[int, list[bir_pb2.Instruction]] = {e: [] for e in (PE, ACT, POOL, DVE, SP)}
        self.bodies: dict[int, list[bir_pb2.Instruction]] = {e: [] for e in self.entries}

    def add(self, engine: int, name: str, op: str, *, body: bool = False, **fields) -> bir_pb2.Instruction:
        waits = fields.pop("waits", ())
        updates = fields.pop("updates", ())
        outputs = fields.pop("outputs", ())
        inputs = fields.pop("inputs", ())
        instruction = bir_pb2.Instruction(name=name, op=op, engine=engine, **fields)
        instruction.outputs.extend(outputs)
        instruction.inputs.extend(inputs)
        if name not in self.drop:
            for semaphore, value, steps in waits:
                words = wait_words(value)
                instruction.waits.add(
                    semaphore=semaphore, value=value, value_lo=words[0], value_hi=words[1], loop_steps=steps
                )
        for semaphore, increment in updates:
            instruction.updates.add(semaphore=semaphore, increment=increment)
        (self.bodies if body else self.entries)[engine].append(instruction)
        return instruction

    def close_nest(self) -> None:
        """Append each engine's body, inside the nest, to its entries."""
        for engine, body in self.bodies.items():
            if not body:
                continue
            entries = self.entries[engine]
            entries.append(
                bir_pb2.Instruction(
                    name=f"pass.{engine}", op="loop", engine=engine, trip_count=self.shape.passes,
                    body_length=len(body) + 1,
                )
            )
            entries.append(
                bir_pb2.Instruction(
                    name=f"tile.{engine}", op="loop", engine=engine, trip_count=self.shape.tiles,
                    body_length=len(body),
                )
            )
            entries.extend(body)
            self.bodies[engine] = []


def _onchip(
    memory: int, address: int, cols: int, dtype: int, slot_bytes: int, slots: int
) -> bir_pb2.AccessPattern:
    """An operand at `address` of `memory` that rotates over `slots` slots with the tile loop."""
    ap = bir_pb2.AccessPattern(
        memory=memory, tensor="@SBUF" if memory == SBUF else "@PSUM", dtype=dtype, offset=address,
        partition_count=PARTITIONS, dims=[bir_pb2.Dim(stride=1, count=cols)],
    )
    if slots > 1:
        ap.loop.add(step=0)
        ap.loop.add(step=0, rotation=[k * slot_bytes for k in range(slots)])
    return ap


def _hbm_tile(tensor: str, cols: int, tile_elements: int) -> bir_pb2.AccessPattern:
    """Row tile i of a [TILES * 128, cols] f32 HBM tensor (offset in elements, stepping with i)."""
    ap = bir_pb2.AccessPattern(
        memory=HBM, tensor=tensor, dtype=F32, offset=0,
        dims=[bir_pb2.Dim(stride=cols, count=PARTITIONS), bir_pb2.Dim(stride=1, count=cols)],
    )
    ap.loop.add(step=0)
    ap.loop.add(step=tile_elements)
    return ap


def pipeline_neff(shape: Shape, drop: Sequence[str] = (), name: str = "pipeline") -> bir_pb2.Neff:
    """The rolled NEFF of the kernel above (`drop`: names of instructions whose waits are left out)."""
    tiles, free, r, p = shape.tiles, shape.free, shape.rotation, shape.psum_rotation
    if tiles % r or tiles % p or tiles < r:
        raise ValueError(f"tiles ({tiles}) must be a multiple of both rotations ({r}, {p})")
    f32_slot, bf16_slot = 4 * free, 2 * free
    w_at, xs_at = 0, 4 * PARTITIONS
    as_at = xs_at + r * f32_slot
    hs_at = as_at + r * f32_slot
    os_at = hs_at + r * bf16_slot
    steps = [tiles, 1]  # g = pass * TILES + i
    total = shape.passes * tiles
    s = _Streams(shape, drop)

    def slot(address: int, dtype: int = F32, memory: int = SBUF, slots: int = r) -> bir_pb2.AccessPattern:
        return _onchip(memory, address, free, dtype, (4 if dtype == F32 else 2) * free, slots)

    w_tile = bir_pb2.AccessPattern(
        memory=SBUF, tensor="@SBUF", dtype=F32, offset=w_at, partition_count=PARTITIONS,
        dims=[bir_pb2.Dim(stride=1, count=PARTITIONS)],
    )
    w_hbm = bir_pb2.AccessPattern(
        memory=HBM, tensor="w", dtype=F32,
        dims=[bir_pb2.Dim(stride=PARTITIONS, count=PARTITIONS), bir_pb2.Dim(stride=1, count=PARTITIONS)],
    )
    # prologue: w in, and the credits of the slot-free semaphores
    s.add(SP, "load_w", "dma", dma_queue=3, outputs=[w_tile], inputs=[w_hbm], updates=[(S_W, 1)])
    s.add(SP, "credit_st", "nop", updates=[(S_ST, tiles)])
    s.add(PE, "credit_mm", "nop", waits=[(S_W, 1, [])], updates=[(S_MM, r)])
    s.add(ACT, "credit_act", "nop", updates=[(S_ACT, p)])
    s.add(DVE, "credit_dve", "nop", updates=[(S_DVE, r)])
    # one tile
    s.add(SP, "ldx", "dma", body=True, dma_queue=0, outputs=[slot(xs_at)],
          inputs=[_hbm_tile("x", free, PARTITIONS * free)], waits=[(S_MM, 1, steps)], updates=[(S_LDX, 1)])
    s.add(ACT, "lda", "dma", body=True, dma_queue=1, outputs=[slot(as_at)],
          inputs=[_hbm_tile("out", free, PARTITIONS * free)],
          waits=[(S_DVE, 1, steps), (S_ST, 1, steps)], updates=[(S_LDA, 1)])
    s.add(PE, "mm", "matmul", body=True, outputs=[slot(0, memory=PSUM, slots=p)],
          inputs=[w_tile, slot(xs_at)], waits=[(S_LDX, 1, steps), (S_ACT, 1, steps)], updates=[(S_MM, 1)])
    s.add(ACT, "act", "activation", body=True, func="tanh", scalars=[1.0, 0.0],
          outputs=[slot(hs_at, BF16)], inputs=[slot(0, memory=PSUM, slots=p)],
          waits=[(S_MM, 1 + r, steps), (S_DVE, 1, steps)], updates=[(S_ACT, 1)])
    s.add(DVE, "free", "drain", body=True, waits=[(S_ST, tiles - r + 1, steps)])
    s.add(DVE, "add", "tensor_tensor", body=True, func="add", outputs=[slot(os_at)],
          inputs=[slot(hs_at, BF16), slot(as_at)], waits=[(S_ACT, 1 + p, steps), (S_LDA, 1, steps)],
          updates=[(S_DVE, 1)])
    # POOL claims the SBUF port it shares with DVE at dispatch: a drain carries its wait (sync_dve_pool)
    s.add(POOL, "ready", "drain", body=True, waits=[(S_DVE, 1 + r, steps)])
    s.add(POOL, "scale", "tensor_scalar", body=True, func="multiply", scalars=[0.5],
          outputs=[slot(os_at)], inputs=[slot(os_at)], updates=[(S_POOL, 1)])
    s.add(SP, "st", "dma", body=True, dma_queue=2, outputs=[_hbm_tile("out", free, PARTITIONS * free)],
          inputs=[slot(os_at)], waits=[(S_POOL, 1, steps)], updates=[(S_ST, 1)])
    s.close_nest()
    # epilogue: every final count, then the reset
    finals = [(S_LDX, total), (S_LDA, total), (S_MM, total + r), (S_ACT, total + p),
              (S_DVE, total + r), (S_POOL, total), (S_ST, total + tiles), (S_W, 1)]
    for k in range(0, len(finals), 2):
        s.add(SP, f"drain{k // 2}", "nop", waits=[(sem, value, []) for sem, value in finals[k : k + 2]])
    s.add(SP, "reset", "sem_reset")

    neff = bir_pb2.Neff(
        magic=MAGIC.decode(), format_version=FORMAT_VERSION, name=name, target="trn1", num_semaphores=8
    )
    rows = tiles * PARTITIONS
    neff.hbm.add(name="x", dtype=F32, shape=[rows, free], role=bir_pb2.INPUT, index=0)
    neff.hbm.add(name="w", dtype=F32, shape=[PARTITIONS, PARTITIONS], role=bir_pb2.INPUT, index=1)
    neff.hbm.add(name="out", dtype=F32, shape=[rows, free], role=bir_pb2.OUTPUT, index=0)
    neff.buffers.add(name="@SBUF", memory=SBUF, partitions=PARTITIONS, bytes_per_partition=196608, address=0)
    neff.buffers.add(name="@PSUM", memory=PSUM, partitions=PARTITIONS, bytes_per_partition=16384, address=0)
    for engine, entries in s.entries.items():
        if entries:
            neff.streams.add(engine=engine).instructions.extend(entries)
    neff.metadata["generator"] = f"bench/sim_gen.py passes={shape.passes} tiles={tiles} free={free}"
    return neff


def pipeline_inputs(shape: Shape, seed: int = 0) -> dict[str, np.ndarray]:
    """arg0 = x [TILES * 128, FREE], arg1 = w [128, 128] (scaled so tanh does not saturate)."""
    rng = np.random.default_rng(seed)
    x = rng.standard_normal((shape.tiles * PARTITIONS, shape.free)).astype(np.float32)
    w = (rng.standard_normal((PARTITIONS, PARTITIONS)) / np.sqrt(PARTITIONS)).astype(np.float32)
    return {"arg0": x, "arg1": w}


def reference_output(shape: Shape, inputs: dict[str, np.ndarray]) -> np.ndarray:
    """What the kernel computes, in numpy (bf16 rounding of tanh included), for checking a run."""
    x, w = inputs["arg0"], inputs["arg1"]
    tiles = x.reshape(shape.tiles, PARTITIONS, shape.free)
    hidden = np.tanh(np.einsum("km,tkn->tmn", w, tiles, dtype=np.float32))
    hidden = dtypes.storage_to_user_array(dtypes.from_compute(hidden, BF16), BF16).astype(np.float32)
    out = np.zeros_like(tiles)
    for _ in range(shape.passes):
        out = ((hidden + out) * np.float32(0.5)).astype(np.float32)
    return out.reshape(x.shape)


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--executed", type=int, default=1_000_000, help="about this many instructions")
    parser.add_argument("--tiles", type=int, default=64)
    parser.add_argument("--free", type=int, default=64, help="f32 columns of a tile")
    parser.add_argument("--drop", default="", help="comma-separated names of instructions to drop waits of")
    parser.add_argument("-o", "--output", required=True, type=Path, help="the NEFF (inputs: NAME.io.npz)")
    args = parser.parse_args(argv)
    shape = shape_for(args.executed, args.tiles, args.free)
    write_neff(args.output, pipeline_neff(shape, [d for d in args.drop.split(",") if d]))
    inputs_path = args.output.with_suffix(".io.npz")
    np.savez(inputs_path, **pipeline_inputs(shape))
    print(f"{args.output}: {shape.executed:,} executed instructions ({shape}); inputs {inputs_path}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
