"""Dead-code elimination on Penguin IR: statements whose results nobody reads, and what they leave.

An intermediate HBM tensor that no statement reads is never needed, so the stores into it go (after
fusion, most intermediates of an elementwise chain are such tensors); a statement whose SBUF/PSUM
output no later statement of its nest reads goes too, back to the loads that fed only it. Module
outputs are always live. Then nests left without statements, and declarations nothing names, go.
"""

from __future__ import annotations

from dataclasses import dataclass

from ncc.schemas import common_pb2, penguin_pb2


@dataclass
class DceStats:
    statements_removed: int = 0
    tensors_removed: int = 0


def eliminate_dead_code(program: penguin_pb2.Program) -> DceStats:
    tensors = {t.name: t for t in program.tensors}

    def base(name: str) -> str:
        return tensors[name].view_of or name

    def on_chip(name: str) -> bool:
        return tensors[name].memory != common_pb2.HBM

    stats = DceStats()
    outputs = {t.name for t in program.tensors if t.role != penguin_pb2.INTERNAL}
    changed = True
    while changed:  # a store that goes can leave the loads (and stores) that fed it dead
        changed = False
        live_hbm = outputs | {base(a.tensor) for nest in program.nests for st in nest.statements
                              for a in st.inputs if not on_chip(a.tensor)}
        # an on-chip tile another nest reads (forwarding.py) is live in the nest that writes it
        read_on_chip = [{a.tensor for st in nest.statements for a in st.inputs if on_chip(a.tensor)}
                        for nest in program.nests]
        read_anywhere: dict[str, int] = {}
        for names in read_on_chip:
            for name in names:
                read_anywhere[name] = read_anywhere.get(name, 0) + 1
        for nest, names in zip(program.nests, read_on_chip, strict=True):
            written = {a.tensor for st in nest.statements for a in st.outputs if on_chip(a.tensor)}
            elsewhere = {name for name in written if read_anywhere.get(name, 0) > (name in names)}
            live_tiles = _live_tiles(nest, live_hbm, base, on_chip, elsewhere)
            kept = [st for st in nest.statements
                    if any(base(a.tensor) in live_hbm if not on_chip(a.tensor) else a.tensor in live_tiles
                           for a in st.outputs)]
            if len(kept) != len(nest.statements):
                stats.statements_removed += len(nest.statements) - len(kept)
                changed = True
                del nest.statements[:]
                nest.statements.extend(kept)
    nests = [n for n in program.nests if n.statements]
    del program.nests[:]
    program.nests.extend(nests)
    named = {a.tensor for nest in program.nests for st in nest.statements for a in [*st.inputs, *st.outputs]}
    named |= {tensors[n].view_of for n in named if tensors[n].view_of}
    kept_tensors = [t for t in program.tensors if t.name in named or t.role != penguin_pb2.INTERNAL]
    stats.tensors_removed = len(program.tensors) - len(kept_tensors)
    del program.tensors[:]
    program.tensors.extend(kept_tensors)
    return stats


def _live_tiles(nest: penguin_pb2.LoopNest, live_hbm: set[str], base, on_chip,
                elsewhere: set[str] = frozenset()) -> set[str]:
    """The on-chip tiles some statement that matters reads, by a worklist over the nest's
    writers (linear: a tile may be read before, in statement order, it is written); tiles in
    `elsewhere` are read by another nest, so they and what feeds them matter too."""
    writers: dict[str, list[penguin_pb2.Statement]] = {}
    pending: list[penguin_pb2.Statement] = []
    for st in nest.statements:
        for access in st.outputs:
            if on_chip(access.tensor):
                writers.setdefault(access.tensor, []).append(st)
                if access.tensor in elsewhere:
                    pending.append(st)
            elif base(access.tensor) in live_hbm:
                pending.append(st)
    live: set[str] = set(elsewhere)
    while pending:
        for access in pending.pop().inputs:
            if on_chip(access.tensor) and access.tensor not in live:
                live.add(access.tensor)
                pending.extend(writers.get(access.tensor, []))
    return live
