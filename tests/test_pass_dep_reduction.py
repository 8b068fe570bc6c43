"""dep_reduction: transitive reduction keeps reachability and edge attributes; too_many_spills skips."""

from __future__ import annotations

import networkx as nx
import pytest
from walrus_builders import Bir, random_program, run_passes

from ncc.tools.common.errors import CompileError
from ncc.tools.walrus_driver.passes.dep_reduction import reduce_in_place


def triangle():
    """load a; b = f(a); c = g(a, b): a->c is implied by a->b->c."""
    b = Bir()
    b.hbm("x", [128, 64])
    for name in ("a", "b", "c"):
        b.buffer(name, 256)
    b.load("a", "x", 128, 64, name="load")
    b.act("b", "a", 128, 64, name="f")
    b.tt("c", "a", "b", 128, 64, name="g")
    return b.build()


def named_edges(ctx):
    name = {i.id: i.name for i in ctx.program.instructions}
    return {(name[a], name[b]): data for a, b, data in ctx.deps.edges(data=True)}


def test_removes_the_transitive_edge_and_keeps_attributes():
    ctx = run_passes(triangle(), "anti_dependency_analyzer")
    assert ("load", "g") in named_edges(ctx)
    ctx = run_passes(ctx.program, "anti_dependency_analyzer,dep_reduction")
    found = named_edges(ctx)
    assert set(found) == {("load", "f"), ("f", "g")}
    assert found[("f", "g")] == {"kind": "FLOW", "memory": "SBUF"}
    assert ctx.stats["dep_reduction"]["edges_removed"] == 1
    assert ctx.deps_reduced


def test_matches_networkx_on_random_programs():
    for seed in range(3):
        ctx = run_passes(random_program(seed, steps=120), "anti_dependency_analyzer", verify_each=False)
        full = ctx.deps.to_networkx()
        reduce_in_place(ctx.deps)
        expected = nx.transitive_reduction(full)
        assert set(ctx.deps.edges) == set(expected.edges)
        reduced = ctx.deps.to_networkx()
        assert set(nx.transitive_closure_dag(reduced).edges) == set(nx.transitive_closure_dag(full).edges)


def test_skipped_for_too_many_spills():
    program = triangle()
    program.attributes["too_many_spills"] = "1"
    ctx = run_passes(program, "anti_dependency_analyzer,dep_reduction")
    assert ctx.stats["dep_reduction"]["skipped_too_many_spills"] == 1
    assert ("load", "g") in named_edges(ctx)
    assert not ctx.deps_reduced


def test_needs_the_analyzer():
    with pytest.raises(CompileError) as err:
        run_passes(triangle(), "dep_reduction")
    assert err.value.code == "E402"
    assert "pass dep_reduction needs anti_dependency_analyzer to run before it" in err.value.message
