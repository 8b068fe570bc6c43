"""The simulator's decoded instruction: a BIR Instruction with its operands resolved to memory.

Decoding once up front (see program.py) keeps the event loop free of protobuf access and moves
every static check (bounds, operand shapes, engine rules) before the first simulated cycle.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from ncc.tools.sim.memory import Access
from ncc.tools.target import ENGINE_NAMES, is_dma


def engine_name(engine: int) -> str:
    return ENGINE_NAMES.get(engine, f"engine{engine}")


def queue_name(queue: int) -> str:
    return f"q{queue}"


@dataclass(eq=False)
class Op:
    """One instruction ready to execute.

    `cost_ns` is how long it occupies its engine (for a dma: the trigger's issue time);
    `transfer_ns` is a dma's time on its queue, `hbm_ns` the time its bytes occupy the core's
    aggregate HBM bandwidth (0 when it touches no HBM). `ports` are the shared memory ports it
    holds while it runs, `dispatch_ports` those it claims as soon as it is next (see timing.py).
    """

    uid: int
    name: str
    op: str
    engine: int
    queue: int
    inputs: list[Access]
    outputs: list[Access]
    func: str = ""
    scalars: tuple[float, ...] = ()
    accumulate: bool = False
    attributes: dict[str, str] = field(default_factory=dict)
    waits: tuple[tuple[int, int], ...] = ()
    updates: tuple[tuple[int, int], ...] = ()
    cost_ns: float = 0.0
    transfer_ns: float = 0.0
    hbm_ns: float = 0.0
    ports: tuple[str, ...] = ()
    dispatch_ports: tuple[str, ...] = ()  # of `ports`, those claimed at dispatch (timing.py)
    is_dma: bool = field(init=False)  # moves data on a queue (target.is_dma), read once per event

    def __post_init__(self) -> None:
        self.is_dma = is_dma(self.op)

    @property
    def moved_bytes(self) -> int:
        """Bytes a dma moves: its on-chip side (an indirect dma's HBM operand is the whole table)."""
        if self.op == "dma_gather":
            return self.outputs[0].nbytes
        return self.inputs[0].nbytes

    @property
    def label(self) -> str:
        """The instruction as messages name it: `'name' (ENGINE)`."""
        return f"{self.name!r} ({engine_name(self.engine)})"

    @property
    def transfer_label(self) -> str:
        """A dma's data movement as messages name it: `'name' (qN)`."""
        return f"{self.name!r} ({queue_name(self.queue)})"
