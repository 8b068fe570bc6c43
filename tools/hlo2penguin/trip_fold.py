"""A while loop's compile-time scalars at every trip, folded for all trips at once.

control.py finds a loop's trip count, and repeat.py the counter's value at every trip, by folding
the loop's compile-time scalars (the counter, what the condition reads) through condition and
body. One trip at a time that costs about 0.2 ms a trip, twice: 4.6 s of a 10,000-step scan's
5.7 s compile, and the reason a kept loop could not run more than 10,000 trips. Where the scalars
are affine in the trip (a counter from a constant by a constant step, as `fori_loop` and `scan`
emit them) they are folded for all trips at once instead: from trip 1 on, every scalar of the
state is a vector over the trips, s1 + (t - 1) * (s2 - s1) from the first two trips folded one at a
time, and condition and body are folded once on those vectors (the folding is elementwise numpy,
so a vector folds as a scalar does). The body's results must equal the next trip's state at every
trip, which proves the closed form by induction from trip 1; the trip count is where the
condition's vector first reads false. Anything else (a counter that doubles, a float counter whose
sum rounds) is folded one trip at a time, as before, as far as a loop may be unrolled (`fold_loop`
does both; a condition on data gives None).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

import numpy as np

from ncc.schemas import hlo_pb2

Folded = tuple | np.ndarray | None  # as control.py folds: one element, a tuple of them, or unknown
FoldValues = Callable[[hlo_pb2.HloComputationProto, list[Folded]], dict[int, Folded]]

FIRST_SPAN = 1024  # trips the condition is first folded over; then 8 times more until it ends


@dataclass
class FoldedTrips:
    """The trip count, and the state's scalars at every trip: `series[j]`, element j's value at
    trips 0..count (count + 1 values, the last what the last trip leaves), or None for an element
    that is not a compile-time scalar at every trip. `evenly`: whether every scalar the body
    computes, at every trip it computes one, steps by the same amount from trip to trip."""

    count: int
    series: list[np.ndarray | None]
    evenly: bool

    def scalar(self, element: int, trip: int) -> np.ndarray:
        """Element `element` of the state at the start of trip `trip`, as folding gives it."""
        return self.series[element][trip:trip + 1]


def steps_evenly(values: np.ndarray) -> bool:
    """Whether the values, one per trip, are first + t * step: the same at every trip (an
    infinity or a NaN too: a body's -inf for a max), or finite and affine in the trip."""
    if len(values) < 2:
        return True
    series = np.asarray(values, dtype=np.float64)
    if np.array_equal(series, np.full_like(series, series[0]), equal_nan=True):
        return True
    with np.errstate(invalid="ignore"):
        return bool(np.array_equal(series, series[0] + (series[1] - series[0]) * np.arange(len(series))))


def fold_loop(fold_values: FoldValues, body: hlo_pb2.HloComputationProto,
              condition: hlo_pb2.HloComputationProto, first: Folded, limit: int,
              one_by_one_limit: int) -> FoldedTrips | None:
    """The loop folded for all trips at once where its scalars are affine in the trip (up to
    `limit` trips), else one trip at a time (up to `one_by_one_limit`); None when the condition
    needs more than the scalars give. Past the limit: count limit + 1 and no series."""
    if isinstance(first, tuple):
        folded = fold_trips(fold_values, body, condition, first, limit)
        if folded is not None:
            return folded
    cond_root, body_root = root_id(condition), root_id(body)
    states, body_series = [first], {}
    for trips in range(one_by_one_limit + 1):
        verdict = fold_values(condition, [states[-1]])[cond_root]
        if not isinstance(verdict, np.ndarray):
            return None
        if not verdict.reshape(-1)[0]:
            return _from_states(states, list(body_series.values()), trips)
        values = fold_values(body, [states[-1]])
        states.append(values[body_root])
        for key, value in values.items():
            if _scalar(value):
                body_series.setdefault(key, []).append(float(value.reshape(-1)[0]))
    return FoldedTrips(one_by_one_limit + 1, [], True)


def fold_trips(fold_values: FoldValues, body: hlo_pb2.HloComputationProto,
               condition: hlo_pb2.HloComputationProto, first: tuple, limit: int) -> FoldedTrips | None:
    """The loop folded for all trips at once (the module docstring), or None where the closed
    form does not hold; a loop that runs past `limit` trips comes back with count limit + 1 and no
    series."""
    cond_root, body_root = root_id(condition), root_id(body)
    verdict = fold_values(condition, [first])[cond_root]
    if not _scalar(verdict):
        return None
    if not verdict.reshape(-1)[0]:
        return FoldedTrips(0, [_one(v) for v in first], True)
    trip0 = fold_values(body, [first])
    second = trip0[body_root]
    if not isinstance(second, tuple) or len(second) != len(first):
        return None
    third = fold_values(body, [second])[body_root]
    if not isinstance(third, tuple) or len(third) != len(first):
        return None
    slopes: list[np.ndarray | None] = []
    for s1, s2 in zip(second, third, strict=True):
        if _scalar(s1) != _scalar(s2) or isinstance(s1, tuple):
            return None  # an element that turns constant, or a nested tuple: trip by trip
        if not _scalar(s1):
            slopes.append(None)
        elif s1.dtype == np.bool_:
            if s1[0] != s2[0]:
                return None
            slopes.append(np.zeros(1, np.int64))
        else:
            slopes.append(s2.astype(np.float64) - s1.astype(np.float64))

    def state(trips: np.ndarray) -> tuple:  # the state at each of `trips` (all >= 1), by the closed form
        return tuple(None if slope is None else _cast(s1.astype(np.float64) + (trips - 1) * slope, s1.dtype)
                     for s1, slope in zip(second, slopes, strict=True))

    def after_trips(trips: np.ndarray) -> dict[int, Folded] | None:
        """The body folded on the closed form's state at `trips`, when its results are the closed
        form's state at the next trips (the induction step), else None."""
        values = fold_values(body, [state(trips)])
        after = values[body_root]
        if not isinstance(after, tuple) or len(after) != len(first):
            return None
        for got, want in zip(after, state(trips + 1), strict=True):
            if (want is None) != (not _per_trip(got, len(trips))):
                return None
            if want is not None and not np.array_equal(np.broadcast_to(got.reshape(-1), want.shape), want):
                return None  # the closed form does not hold at some trip
        return values

    count, span = None, FIRST_SPAN
    while count is None:
        span = min(span, limit)
        trips = np.arange(1, span + 1)
        verdicts = fold_values(condition, [state(trips)])[cond_root]
        if not isinstance(verdicts, np.ndarray) or verdicts.size not in (1, span):
            return None
        verdicts = np.broadcast_to(verdicts.reshape(-1), (span,))
        stops = np.flatnonzero(~verdicts.astype(bool))
        if len(stops):
            count = int(stops[0]) + 1
        elif span >= limit:  # past the limit, if the closed form holds that far (a counter that
            # doubles does not: its first two trips extrapolated, it ran 2, 4, 6, ... past 2**30)
            return FoldedTrips(limit + 1, [], True) if after_trips(trips) is not None else None
        else:
            span *= 8
    series: list[np.ndarray | None] = [None] * len(first)
    evenly = True
    if count > 1:
        values = after_trips(np.arange(1, count))
        if values is None:
            return None
        for key, value in trip0.items():  # every scalar the body computes, at every trip
            later = values.get(key)
            if _scalar(value) and _per_trip(later, count - 1):
                whole = np.concatenate([value.reshape(-1), np.broadcast_to(later.reshape(-1), (count - 1,))])
                evenly = evenly and steps_evenly(whole)
    else:
        evenly = all(steps_evenly(v.reshape(-1)) for v in trip0.values() if _scalar(v))
    all_trips = np.arange(1, count + 1)
    for j, (s0, value) in enumerate(zip(first, state(all_trips), strict=True)):
        if _scalar(s0) and value is not None:
            series[j] = np.concatenate([s0.reshape(-1), value])
    return FoldedTrips(count, series, evenly)


def _from_states(states: list[Folded], body_series: list[list[float]], count: int) -> FoldedTrips:
    """A FoldedTrips from states folded one trip at a time (states[t] at the start of trip t, and
    one after the last) and the series of every scalar the body computed."""
    series: list[np.ndarray | None] = []
    for j in range(len(states[0]) if isinstance(states[0], tuple) else 0):
        values = [s[j] if isinstance(s, tuple) else None for s in states]
        series.append(np.concatenate([v.reshape(-1) for v in values])
                      if all(_scalar(v) for v in values) else None)
    evenly = all(steps_evenly(np.asarray(values)) for values in body_series if len(values) == count)
    return FoldedTrips(count, series, evenly)


def root_id(comp: hlo_pb2.HloComputationProto) -> int:
    """The id of a computation's root (its last instruction where root_id names none)."""
    ids = {i.id for i in comp.instructions}
    return comp.root_id if comp.root_id in ids else comp.instructions[-1].id


def _scalar(value: Folded) -> bool:
    return isinstance(value, np.ndarray) and value.size == 1


def _per_trip(value: Folded, trips: int) -> bool:
    """Whether a value folded on the state's vectors is a scalar at each of `trips` trips (one
    value for all, or one per trip)."""
    return isinstance(value, np.ndarray) and value.size in (1, trips)


def _one(value: Folded) -> np.ndarray | None:
    return value.reshape(-1)[:1] if _scalar(value) else None


def _cast(values: np.ndarray, dtype: np.dtype) -> np.ndarray:
    """The closed form's values in the element's own type (integers wrap as the folding's do)."""
    if np.issubdtype(dtype, np.integer):
        return values.astype(np.int64).astype(dtype)
    return values.astype(dtype)
