"""Software pipelining (SoftwarePipelineCodeGen): overlap consecutive iterations of a loop by cutting
its body into stages and running stage s of iteration iv − s at iteration iv.

Why: in program order a loop runs its iterations one after another, and each engine takes its
instructions in that order, so a chain of work that passes between engines leaves each waiting for
the others. Pipelined in N stages, iteration iv loads while iv − 1 computes and iv − 2 stores.
(The backend's list scheduler, -O1 and above, reorders across iterations itself; at -O0 program
order is the schedule.) The loop is extended to ub + N − 1 iterations; stage s is guarded by
iv ≥ s and iv < ub + s (no peeled prologue or epilogue) and reads iteration iv − s (the axis is
shifted in its accesses and predicates); every statement is tagged with its `stage`. Before
anything changes, the new schedule is checked with ISL: every RAW/WAR/WAW dependence of the loop
must keep its direction, or the request is refused (E304) naming the dependence and its first
violated instance. Then each SBUF tile local to the loop gets `max(use stage) − min(def stage) + 1`
iterations per block along the pipelined axis (widening; see docs/architecture.md for what a
widened block is in this IR).

Requests (E303 for a malformed one): Mode A — `num_stages` on a nest or an axis, the HLO frontend
attribute `ncc_num_stages` (carried onto nests as `frontend:ncc_num_stages`), or --num-stages for
every eligible loop; the body is cut in program order into N contiguous groups, and the new body
runs them one after another or interleaved statement by statement, whichever an estimate of
in-order engines finds faster (`body_orders`). Mode B — `stage_id` on every statement (optional
`execution_order` to interleave stages in the new body).
"""

from __future__ import annotations

import sys
from dataclasses import dataclass

from ncc.schemas import common_pb2, penguin_pb2
from ncc.tools.common import affine
from ncc.tools.common.dtypes import itemsize
from ncc.tools.common.errors import CompileError
from ncc.tools.hlo_opt.dependences import Violation, axis_names, first_reversed_dependence, instance
from ncc.tools.hlo_opt.estimate import statement_ns
from ncc.tools.target import PARTITIONS, is_dma, load_target

NUM_STAGES = "num_stages"  # Mode A request, on a nest or one of its axes
FRONTEND_NUM_STAGES = "frontend:ncc_num_stages"  # the same, from the HLO op's frontend_attributes
STAGE_ID = "stage_id"  # Mode B: a statement's stage
EXECUTION_ORDER = "execution_order"  # Mode B: a statement's position in the pipelined body
STAGE = "stage"  # the stage each statement runs in, once pipelined
PIPELINED = "pipelined"  # on the pipelined axis: its number of stages
ROW_BLOCK = "row_block"  # on a dot's nest that tile_order reordered: row tiles per block
ESTIMATED_ITERATIONS = 16  # how many iterations body_orders' estimate runs (fewer when the loop has fewer)
MAX_WIDENED_BYTES = 64 * 1024  # per partition: a block widened along the free dim stays below this
# Every attribute that asks for software pipelining or records that it happened.
PIPELINING_KEYS = frozenset({NUM_STAGES, FRONTEND_NUM_STAGES, STAGE_ID, EXECUTION_ORDER, STAGE, PIPELINED})


def requests_pipelining(nest: penguin_pb2.LoopNest) -> bool:
    """Whether the nest, one of its axes or one of its statements asks for (or already got) software
    pipelining: passes that would change its tiling or loop order leave such a nest as it is, since
    the request was made on the nest as written."""
    annotated = (nest.attributes, *(axis.attributes for axis in nest.axes),
                 *(st.attributes for st in nest.statements))
    return any(PIPELINING_KEYS & attributes.keys() for attributes in annotated)


@dataclass
class PipelineStats:
    loops_pipelined: int = 0
    tensors_widened: int = 0
    loops_skipped: int = 0  # --num-stages loops left alone: too short a body, or illegal


@dataclass
class Plan:
    """How one nest is pipelined: the axis, each statement's stage, the new body order."""

    axis: int  # index into nest.axes
    stages: list[int]  # per statement, program order
    order: list[int]  # statement indices in the pipelined body's order
    num_stages: int
    explicit: bool  # an annotation asked (refuse if illegal), not --num-stages (skip if illegal)


def pipeline_loops(program: penguin_pb2.Program, num_stages: int = 0, widen: bool = True,
                   check_order: bool = True) -> PipelineStats:
    """Pipeline every loop that asks for it (or every eligible loop, given `num_stages` > 1)."""
    tensors = {t.name: t for t in program.tensors}
    stats = PipelineStats()
    for nest in program.nests:
        plan = plan_nest(nest, num_stages, check_order)
        if plan is None:
            continue
        violation = legal_order(nest, tensors, plan)
        if violation is not None:
            text = describe(nest, plan, violation)
            if plan.explicit:
                raise CompileError("E304", text, _where(nest))
            _log(f"nest '{nest.name}' left unpipelined (--num-stages): {text}")
            stats.loops_skipped += 1
            continue
        axis = nest.axes[plan.axis]
        ub = axis.extent
        realize(nest, plan)
        _log(f"nest '{nest.name}': Chosen number of pipeline stages: {plan.num_stages}")
        _log(f"nest '{nest.name}': loop {axis.name} bounds [0, {ub}) -> [0, {axis.extent})")
        stats.loops_pipelined += 1
        if widen:
            stats.tensors_widened += widen_buffers(program, nest)
    return stats


def _log(text: str) -> None:
    print(f"pipeline: {text}", file=sys.stderr)


def _where(nest: penguin_pb2.LoopNest) -> str:
    """A diagnostic's location: the HLO instruction the nest came from, else the nest."""
    return nest.source or nest.name


# -- requests -----------------------------------------------------------------------------------


def plan_nest(nest: penguin_pb2.LoopNest, default: int = 0, check_order: bool = True) -> Plan | None:
    """The nest's pipelining request, validated; None when it asks for nothing (or was done)."""
    axis_requests = [(k, a.attributes[NUM_STAGES]) for k, a in enumerate(nest.axes)
                     if NUM_STAGES in a.attributes]
    done = [k for k, a in enumerate(nest.axes) if PIPELINED in a.attributes]
    nested = [nest.axes[k].name for k, _ in axis_requests] + [nest.axes[k].name for k in done]
    if len(set(nested)) > 1:
        raise CompileError("E303", f"Nested pipelining is not supported: nest '{nest.name}' would pipeline "
                                   f"loops {' and '.join(sorted(set(nested)))}", _where(nest))
    if done:
        return None
    nest_request = nest.attributes.get(NUM_STAGES, nest.attributes.get(FRONTEND_NUM_STAGES))
    mode_a = bool(axis_requests) or nest_request is not None
    mode_b = any(STAGE_ID in st.attributes for st in nest.statements)
    if mode_a and mode_b:
        raise CompileError("E303", "Cannot use both num_stages attribute and stage_id annotations "
                                   "simultaneously", _where(nest))
    count = len(nest.statements)
    if mode_b:
        stages, order = _stage_ids(nest, check_order)
        n = max(stages) + 1
        axis = choose_axis(nest)
        if axis is None:
            raise CompileError("E303", f"nest '{nest.name}' has stage_id annotations but no loop to pipeline "
                                       "(no axis of more than one iteration that its accesses advance along)",
                               _where(nest))
        return Plan(axis, stages, order, n, explicit=True) if n > 1 else None
    if mode_a:
        axis, text = axis_requests[0] if axis_requests else (None, nest_request)
        n = _positive(text, _where(nest))
    else:
        axis, n = None, default
        if n > 1 and ROW_BLOCK in nest.attributes:
            # tile_order already overlaps this dot's row block; pipelining a loop of it as well
            # would hold num_stages blocks of accumulators at once, more than PSUM has
            _log(f"nest '{nest.name}' not pipelined (--num-stages): its tiles are ordered in row blocks "
                 f"of {nest.attributes[ROW_BLOCK]}")
            return None
    if n <= 1:
        return None
    if axis is None:
        axis = choose_axis(nest)
    if axis is None or nest.axes[axis].extent < 2:
        if mode_a:
            _log(f"nest '{nest.name}' not pipelined: no loop of more than one iteration that its accesses "
                 "advance along")
        return None
    if n > count:
        if not mode_a:
            return None
        raise CompileError("E303", f"num_stages {n} is more than the {count} statements of the body of nest "
                                   f"'{nest.name}': each stage needs at least one", _where(nest))
    return Plan(axis, [k * n // count for k in range(count)], list(range(count)), n, explicit=mode_a)


def legal_order(nest: penguin_pb2.LoopNest, tensors: dict[str, penguin_pb2.TensorDecl],
                plan: Plan) -> Violation | None:
    """Settle the pipelined body's order and check it: Mode B's is the annotations'; Mode A takes
    the first of `body_orders` that reverses no dependence. Returns the reversed dependence when
    none is legal (program order's, which is what the request was written against)."""
    if any(STAGE_ID in st.attributes for st in nest.statements):
        return check_schedule(nest, tensors, plan)
    first = None
    for order in body_orders(nest, tensors, plan.stages, nest.axes[plan.axis].extent):
        plan.order = order
        violation = check_schedule(nest, tensors, plan)
        if violation is None:
            return None
        if order == sorted(order):
            first = violation
    plan.order = list(range(len(plan.stages)))
    return first


def body_orders(nest: penguin_pb2.LoopNest, tensors: dict[str, penguin_pb2.TensorDecl], stages: list[int],
                extent: int) -> list[list[int]]:
    """Mode A's candidate bodies, best first: the stages one after another (program order), and
    interleaved statement by statement (the first statement of every stage, then the second, ...),
    ranked by `in_order_makespan`; program order first unless interleaving is estimated at least
    1 % faster.

    Why: each engine runs its instructions in the order it is given them, and without the
    backend's list scheduler (-O0) that order is the body's. A chain that alternates engines
    (ACT, DVE, ACT, ...) leaves each engine idle while the other works unless the body interleaves
    iterations; a chain that stays on one engine may run better grouped. Interleaving keeps every
    stage's own order, so it reverses no dependence that program order keeps, and it can keep one
    that program order reverses (a value a later stage updates and an earlier one reads at the
    next iteration)."""
    grouped = list(range(len(stages)))
    first: dict[int, int] = {}
    for k, stage in enumerate(stages):
        first.setdefault(stage, k)
    interleaved = sorted(grouped, key=lambda k: (k - first[stages[k]], stages[k]))
    if interleaved == grouped:
        return [grouped]
    durations = [statement_ns(st, tensors) for st in nest.statements]
    iterations = min(extent, ESTIMATED_ITERATIONS)
    makespan_grouped = in_order_makespan(nest, stages, grouped, durations, iterations)
    if in_order_makespan(nest, stages, interleaved, durations, iterations) < 0.99 * makespan_grouped:
        return [interleaved, grouped]
    return [grouped, interleaved]


def in_order_makespan(nest: penguin_pb2.LoopNest, stages: list[int], order: list[int], durations: list[float],
                      iterations: int) -> float:
    """An estimate of the time the pipelined loop takes over `iterations`, fill and drain
    included: a compute statement starts once its engine is done with the ones before it in the
    body and the statements of its own iteration that wrote a tensor it reads have finished; a dma,
    whose trigger engine and queue the backend picks (loads run ahead on SP, stores go to other
    engines), waits only for those and lands its transfer time and the queues' fixed latency
    later."""
    statements = list(nest.statements)
    producers = [[j for j in range(k) if {a.tensor for a in statements[j].outputs}
                  & {a.tensor for a in statements[k].inputs}] for k in range(len(statements))]
    latency = load_target().dma_fixed_latency_ns
    finish: dict[tuple[int, int], float] = {}
    free: dict[int, float] = {}  # engine -> when it is done with what it was given so far
    for body in range(iterations + max(stages)):
        for k in order:
            iteration = body - stages[k]
            if not 0 <= iteration < iterations:
                continue  # guarded off: the loop has not reached this stage yet, or is past it
            ready = max((finish.get((iteration, j), 0.0) for j in producers[k]), default=0.0)
            if is_dma(statements[k].op):
                finish[iteration, k] = ready + durations[k] + latency
            else:
                engine = statements[k].engine
                finish[iteration, k] = free[engine] = max(ready, free.get(engine, 0.0)) + durations[k]
    return max(finish.values(), default=0.0)


def choose_axis(nest: penguin_pb2.LoopNest) -> int | None:
    """The loop to pipeline: the outermost axis of more than one iteration that some access advances
    along (its variable has a nonzero coefficient in an access start)."""
    moving = {t.var for st in nest.statements for a in [*st.inputs, *st.outputs] for s in a.starts
              for t in s.terms if t.coeff}
    for k, axis in enumerate(nest.axes):
        if axis.extent > 1 and axis.name in moving:
            return k
    return None


def _positive(text: str, where: str) -> int:
    try:
        value = int(text)
    except ValueError:
        value = 0
    if value < 1:
        raise CompileError("E303", f"num_stages must be a positive integer, got '{text}'", where)
    return value


def _integer(st: penguin_pb2.Statement, key: str) -> int:
    try:
        return int(st.attributes[key])
    except ValueError:
        raise CompileError("E303", f"{key} of statement '{st.name}' must be an integer, got "
                                   f"'{st.attributes[key]}'", st.name) from None


def _stage_ids(nest: penguin_pb2.LoopNest, check_order: bool) -> tuple[list[int], list[int]]:
    """Mode B: each statement's stage_id and the body order, validated."""
    statements = list(nest.statements)
    for st in statements:
        if STAGE_ID not in st.attributes:
            raise CompileError("E303", f"stage_id must be on every statement of the loop body or on none: "
                                       f"'{st.name}' has none", _where(nest))
    stages = [_integer(st, STAGE_ID) for st in statements]
    distinct = sorted(set(stages))
    if distinct != list(range(len(distinct))):
        raise CompileError("E303", f"Stage ids must be consecutive starting from 0, got {distinct}",
                           _where(nest))
    for k in range(1, len(statements)):
        if stages[k] < stages[k - 1]:
            raise CompileError("E303", f"Stage ids must be monotonically increasing in program order: "
                                       f"'{statements[k].name}' (stage {stages[k]}) follows "
                                       f"'{statements[k - 1].name}' (stage {stages[k - 1]})", _where(nest))
    if not any(EXECUTION_ORDER in st.attributes for st in statements):
        return stages, list(range(len(statements)))
    for stage in distinct:
        members = [k for k in range(len(statements)) if stages[k] == stage]
        missing = [statements[k].name for k in members if EXECUTION_ORDER not in statements[k].attributes]
        if len(missing) == len(members):
            raise CompileError("E303", f"Execution orders must be all absent or all present: stage {stage} "
                                       "has none", _where(nest))
        if missing:
            raise CompileError("E303", f"Execution order missing in ordered stage {stage}: '{missing[0]}' "
                                       "has none", _where(nest))
    orders = [_integer(st, EXECUTION_ORDER) for st in statements]
    if check_order:
        if sorted(orders) != list(range(len(orders))):
            raise CompileError("E303", f"Execution orders must be consecutive starting from 0, got "
                                       f"{sorted(orders)}", _where(nest))
        last: dict[int, int] = {}
        for k, stage in enumerate(stages):
            if stage in last and orders[k] < orders[last[stage]]:
                raise CompileError("E303", f"Execution orders must increase within a stage: "
                                           f"'{statements[k].name}' (order {orders[k]}) follows "
                                           f"'{statements[last[stage]].name}' (order {orders[last[stage]]}) "
                                           f"in stage {stage}", _where(nest))
            last[stage] = k
    return stages, sorted(range(len(statements)), key=lambda k: (orders[k], k))


# -- legality -----------------------------------------------------------------------------------


def check_schedule(nest: penguin_pb2.LoopNest, tensors: dict[str, penguin_pb2.TensorDecl],
                   plan: Plan) -> Violation | None:
    """The dependence the pipelined schedule reverses first, or None when it keeps all of them.

    The pipelined schedule is [axes with the pipelined one + stage, new position]; statements of
    the same stage whose relative order is unchanged keep every pair's order and are not checked.
    """
    names = axis_names(nest)
    position = {k: pos for pos, k in enumerate(plan.order)}
    schedule = []
    for k in range(len(nest.statements)):
        shifted = list(names)
        shifted[plan.axis] = f"{names[plan.axis]} + {plan.stages[k]}"
        schedule.append(f"{', '.join(shifted)}, {position[k]}")

    def keeps_order(k1: int, k2: int) -> bool:
        return plan.stages[k1] == plan.stages[k2] and (position[k1] < position[k2]) == (k1 < k2)

    return first_reversed_dependence(nest, tensors, schedule, keeps_order)


def describe(nest: penguin_pb2.LoopNest, plan: Plan, violation: Violation) -> str:
    """The refusal: which dependence the schedule reverses, as a relation, and where first."""
    source, sink = nest.statements[violation.source], nest.statements[violation.sink]
    dependence = violation.dependence
    if len(dependence) > 400:
        dependence = dependence[:397] + "..."
    return (f"{plan.num_stages}-stage pipelining of loop {nest.axes[plan.axis].name} of nest '{nest.name}' "
            f"violates the {violation.kind} dependence {source.name} (stage {plan.stages[violation.source]}) "
            f"-> {sink.name} (stage {plan.stages[violation.sink]}) on '{violation.tensor}': {dependence}; "
            f"first violated instance {instance(nest, violation.source, violation.first[0])} -> "
            f"{instance(nest, violation.sink, violation.first[1])}")


# -- realization --------------------------------------------------------------------------------


def realize(nest: penguin_pb2.LoopNest, plan: Plan) -> None:
    """Extend the loop to ub + N − 1, guard and shift each stage, reorder the body, tag stages."""
    axis = nest.axes[plan.axis]
    name, ub = axis.name, axis.extent
    axis.extent = ub + plan.num_stages - 1
    axis.attributes[PIPELINED] = str(plan.num_stages)
    body = []
    for k in plan.order:
        st = penguin_pb2.Statement()
        st.CopyFrom(nest.statements[k])
        stage = plan.stages[k]
        st.attributes[STAGE] = str(stage)
        for access in [*st.inputs, *st.outputs]:
            for start in access.starts:
                _shift(start, name, stage)
        for predicate in st.predicates:
            _shift(predicate.expr, name, stage)
        st.predicates.append(affine.at_least(name, stage))  # iv >= s
        st.predicates.append(penguin_pb2.Predicate(expr=affine.expr({name: -1}, ub + stage - 1),
                                                   relation=penguin_pb2.GE))  # iv < ub + s
        body.append(st)
    del nest.statements[:]
    nest.statements.extend(body)


def _shift(expr: penguin_pb2.AffineExpr, name: str, stage: int) -> None:
    """Substitute name − stage for name: stage s works on iteration iv − s."""
    for term in expr.terms:
        if term.var == name:
            expr.constant -= term.coeff * stage


# -- buffers ------------------------------------------------------------------------------------


def buffer_counts(program: penguin_pb2.Program, nest: penguin_pb2.LoopNest) -> dict[str, int]:
    """Per SBUF tensor local to the pipelined nest: max(use stage) − min(def stage) + 1, the number
    of its iterations alive at once. Tensors no statement writes or none reads are skipped, and so
    are tensors other nests touch and the kernel's inputs and outputs."""
    tensors = {t.name: t for t in program.tensors}
    elsewhere = {a.tensor for other in program.nests if other is not nest for st in other.statements
                 for a in [*st.inputs, *st.outputs]}
    defs: dict[str, list[int]] = {}
    uses: dict[str, list[int]] = {}
    for st in nest.statements:
        stage = int(st.attributes.get(STAGE, "0"))
        for access in st.outputs:
            defs.setdefault(access.tensor, []).append(stage)
        for access in st.inputs:
            uses.setdefault(access.tensor, []).append(stage)
    counts = {}
    for name in defs.keys() & uses.keys():
        tensor = tensors[name]
        if tensor.memory != common_pb2.SBUF or tensor.role != penguin_pb2.INTERNAL or name in elsewhere:
            continue
        counts[name] = max(uses[name]) - min(defs[name]) + 1
    return counts


def widen_buffers(program: penguin_pb2.Program, nest: penguin_pb2.LoopNest) -> int:
    """Multiply each local SBUF tensor's block along the pipelined axis by its buffer count, so one
    block holds the iterations in flight; returns how many tensors were widened."""
    tensors = {t.name: t for t in program.tensors}
    (axis,) = [a.name for a in nest.axes if PIPELINED in a.attributes]
    widened = 0
    for name, count in sorted(buffer_counts(program, nest).items()):
        if count <= 1:
            continue
        tensor = tensors[name]
        if tensor.num_buffers > 1:
            raise CompileError("E303", f"tensor '{name}' is multi-buffered explicitly (num_buffers="
                                       f"{tensor.num_buffers}) and pipelining would widen it to {count} "
                                       "iterations: the two cannot be combined (drop num_buffers, or "
                                       "pipeline{widen=0})", _where(nest))
        dim = _advancing_dimension(nest, name, axis)
        if dim is None:
            continue
        d, step = dim
        block = list(tensor.block_shape)
        rank = len(block)
        if block[d] != step or (d == rank - 2 and PARTITIONS % step) or (d < rank - 2 and step != 1):
            continue  # the block does not hold exactly one iteration: leave it
        block[d] = step * count
        if d == rank - 1 and block[-1] * itemsize(tensor.dtype) > MAX_WIDENED_BYTES:
            continue  # one buffer would hold every iteration in flight: keep it small
        tensor.block_shape[d] = block[d]
        widened += 1
        _log(f"nest '{nest.name}': tensor '{name}' holds {count} iterations of loop {axis} per block "
             f"(block {block})")
    return widened


def _advancing_dimension(nest: penguin_pb2.LoopNest, tensor: str, axis: str) -> tuple[int, int] | None:
    """(dimension, step) when every access to `tensor` advances one dimension by the same step per
    iteration of `axis` and no other; None otherwise."""
    found = set()
    for st in nest.statements:
        for access in [*st.inputs, *st.outputs]:
            if access.tensor != tensor:
                continue
            moves = [(d, t.coeff) for d, s in enumerate(access.starts) for t in s.terms
                     if t.var == axis and t.coeff]
            if len(moves) != 1:
                return None
            found.add(moves[0])
    return found.pop() if len(found) == 1 else None
