"""The layering rules, read from the source: imports point down, front ends go through
the door, pure layers stay pure. A violation names the file and the import."""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

import minidist

PKG = Path(minidist.__file__).parent
FRONT_ENDS = ["aio.py", "api.py", "objects.py", "kvstore.py", "shared_array.py", "torch", "ray",
              "gymnasium"]
BELOW_THE_DOOR = ("minidist.engine", "minidist.rendezvous", "minidist.transport",
                  "minidist.session")
PURE = ["wire.py", "plan.py", "prepared.py", "placement.py", "shm/planner.py", "socket_plan.py",
        "algorithms/schedule.py", "algorithms/analysis.py", "algorithms/cost.py",
        "gymnasium/_records.py"]


def _files(entry: str) -> list[Path]:
    p = PKG / entry
    return sorted(p.rglob("*.py")) if p.is_dir() else [p]


def _imports(path: Path) -> list[tuple[str, set[str]]]:
    """(absolute module, names imported from it) for every import in ``path``."""
    module = ".".join(path.relative_to(PKG.parent).with_suffix("").parts)
    package = module.rsplit(".", 1)[0] if path.name != "__init__.py" else module
    out = []
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.Import):
            out += [(a.name, set()) for a in node.names]
        elif isinstance(node, ast.ImportFrom):
            base = package
            for _ in range(node.level - 1):
                base = base.rsplit(".", 1)[0]
            name = node.module or ""
            target = (f"{base}.{name}" if name else base) if node.level else name
            names = {a.name for a in node.names}
            out.append((target, names))
            out += [(f"{target}.{n}", set()) for n in names]
    return out


@pytest.mark.parametrize("entry", FRONT_ENDS)
def test_front_ends_go_through_the_door(entry):
    for path in _files(entry):
        for target, _ in _imports(path):
            assert not target.startswith(BELOW_THE_DOOR), f"{path.name} imports {target}"
        assert "_current(" not in path.read_text(), f"{path.name} reaches around the API"


def test_the_engine_imports_no_rendezvous_module():
    parts = sorted((PKG / "engine").glob("*.py"))
    assert len(parts) >= 5  # the engine in parts: peers, aborts, p2p, runner and the rest
    for path in parts:
        for target, _ in _imports(path):
            assert not target.startswith("minidist.rendezvous"), f"{path.name}: {target}"


@pytest.mark.parametrize("entry", PURE)
def test_pure_layers_import_no_io(entry):
    for target, _ in _imports(PKG / entry):
        root = target.split(".")[0]
        assert root not in ("socket", "asyncio", "selectors", "threading"), \
            f"{entry} imports {target}"
        assert not target.startswith(BELOW_THE_DOOR + ("minidist.runtime",)), target


def test_no_import_cycle():
    """minidist's modules form no import cycle at import time (imports inside functions,
    which run later, are allowed)."""
    graph: dict[str, set[str]] = {}
    for path in PKG.rglob("*.py"):
        mod = ".".join(path.relative_to(PKG.parent).with_suffix("").parts)
        mod = mod.removesuffix(".__init__")
        tree = ast.parse(path.read_text())
        deps = set()
        for node in tree.body:  # top level only: lazy imports inside functions are fine
            if isinstance(node, (ast.Import, ast.ImportFrom)):
                for target, _ in _imports_of(node, mod, path):
                    if target.startswith("minidist.") and target != mod:
                        deps.add(target)
        graph[mod] = deps
    modules = set(graph)

    def resolve(t: str) -> str | None:
        while t and t not in modules:
            t = t.rsplit(".", 1)[0] if "." in t else ""
        return t or None

    # a submodule importing names from its own package is how packages work, not a cycle
    edges = {m: {r for d in deps if (r := resolve(d)) and r != m
                 and not m.startswith(r + ".")}
             for m, deps in graph.items()}
    seen: dict[str, int] = {}

    def visit(m: str, stack: list[str]) -> None:
        seen[m] = 1
        for n in edges.get(m, ()):
            if seen.get(n) == 1:
                raise AssertionError("import cycle: " + " -> ".join(stack + [m, n]))
            if n not in seen:
                visit(n, stack + [m])
        seen[m] = 2

    for m in sorted(edges):
        if m not in seen:
            visit(m, [])


def _imports_of(node: ast.AST, mod: str, path: Path) -> list[tuple[str, set[str]]]:
    package = mod if path.name == "__init__.py" else mod.rsplit(".", 1)[0]
    if isinstance(node, ast.Import):
        return [(a.name, set()) for a in node.names]
    base = package
    for _ in range(node.level - 1):
        base = base.rsplit(".", 1)[0]
    target = (f"{base}.{node.module}" if node.module else base) if node.level else node.module
    return [(target, set())] + [(f"{target}.{a.name}", set()) for a in node.names]


SHM_INSIDE = ("_core", "area_layout", "rooted_area", "rooted_core", "waits", "inbox")


def test_the_shared_memory_paths_live_in_one_subpackage():
    """One node's shared-memory paths are minidist/shm: the layouts, both executors and
    the interface the session calls. Nothing outside it reaches the layouts or the
    compiled core, and no fast-path module lies beside the package's other modules."""
    inside = {f"minidist.shm.{m}" for m in SHM_INSIDE}
    for path in PKG.rglob("*.py"):
        if path.is_relative_to(PKG / "shm"):
            continue
        for target, _ in _imports(path):
            assert target not in inside, f"{path.relative_to(PKG)} imports {target}"
    assert sorted(p.name for p in PKG.glob("fast*.py")) == []
    assert (PKG / "shm" / "_core.c").is_file()
