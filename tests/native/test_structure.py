"""minidist_native is a front end: it reaches minidist through the door and the public
API, never below it, and never through another module's private helpers."""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

import minidist_native

PKG = Path(minidist_native.__file__).parent
BELOW_THE_DOOR = ("minidist.engine", "minidist.rendezvous", "minidist.transport",
                  "minidist.session", "minidist.runtime", "minidist.startup")

pytestmark = pytest.mark.timeout(30)


def _imports(path: Path):
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.Import):
            for a in node.names:
                yield a.name, None
        elif isinstance(node, ast.ImportFrom) and node.level == 0:
            for a in node.names:
                yield node.module, a.name


@pytest.mark.parametrize("path", sorted(PKG.glob("*.py")), ids=lambda p: p.name)
def test_only_the_door_and_public_names(path):
    for module, name in _imports(path):
        assert not module.startswith(BELOW_THE_DOOR), f"{path.name} imports {module}"
        if module.startswith("minidist.") or module == "minidist":
            assert name is None or not name.startswith("_"), \
                f"{path.name} imports the private {module}.{name}"
    text = path.read_text()
    assert "_current(" not in text and "._session" not in text, path.name


def test_the_top_level_imports_no_torch():
    top = [PKG / "__init__.py", PKG / "_api.py", PKG / "_errors.py", PKG / "_keys.py",
           PKG / "_availability.py", PKG / "_nccl.py", PKG / "_records.py"]
    for path in top:
        tree = ast.parse(path.read_text())
        for node in tree.body:  # module level only: imports inside functions are lazy
            if isinstance(node, (ast.Import, ast.ImportFrom)):
                names = [a.name for a in node.names] if isinstance(node, ast.Import) \
                    else [node.module or ""]
                assert not any(n.split(".")[0] == "torch" for n in names), path.name
