"""The orchestrator's layout: its parts are packages, its top level stays small, and no module
imports itself back through others (networkx over the import graph read with ast: every import
statement counts, inside functions and under TYPE_CHECKING too)."""

from __future__ import annotations

import ast
from pathlib import Path

import networkx as nx

ORCHESTRATOR = Path(__file__).resolve().parents[1] / "orchestrator"
PARTS = {"commands", "pipeline", "farm", "triage"}


def _module_name(path: Path) -> str:
    parts = path.relative_to(ORCHESTRATOR).with_suffix("").parts
    if parts[-1] == "__init__":
        parts = parts[:-1]
    return ".".join(("ncc.orchestrator", *parts))


def import_graph() -> nx.DiGraph:
    modules = {_module_name(path): path for path in ORCHESTRATOR.rglob("*.py")}
    graph = nx.DiGraph()
    graph.add_nodes_from(modules)
    for name, path in modules.items():
        for node in ast.walk(ast.parse(path.read_text())):
            targets: list[str] = []
            if isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
                targets = [f"{node.module}.{alias.name}" for alias in node.names] + [node.module]
            elif isinstance(node, ast.Import):
                targets = [alias.name for alias in node.names]
            for target in targets:
                if target in modules and target != name and not name.startswith(target + "."):
                    graph.add_edge(name, target)
    return graph


def test_no_import_circles():
    graph = import_graph()
    # a package's __init__ is imported by its modules' importers anyway; count module-to-module edges
    cycles = [c for c in nx.simple_cycles(graph) if len(c) > 1]
    assert not cycles, cycles


def test_the_top_level_holds_the_parts_and_a_few_shared_modules():
    top = sorted(p.stem for p in ORCHESTRATOR.glob("*.py"))
    assert len(top) <= 10, top
    packages = {p.name for p in ORCHESTRATOR.iterdir() if (p / "__init__.py").is_file()}
    assert packages == PARTS
    for part in PARTS:
        doc = ast.get_docstring(ast.parse((ORCHESTRATOR / part / "__init__.py").read_text()))
        assert doc and len(doc) > 80, part  # says what the part is for and what is in it


def test_every_command_is_a_module_of_commands():
    cli = (ORCHESTRATOR / "cli.py").read_text()
    for command in (ORCHESTRATOR / "commands").glob("*.py"):
        if command.stem != "__init__":
            assert f'"ncc.orchestrator.commands.{command.stem}"' in cli, command.stem
