"""The rules of issue 28 ("one home per concept"), read from the source of minidist and
minidist_native: no import cycle (imports inside functions included), no class over 400
lines, no access to another module's or object's private names, control-message dicts
only in the control catalog, and no frame-header parsing in the transport's reader.

Each check names its offenders. Offenders that remain are listed in an allowlist beside
the check: a new offender fails, and so does an entry that no longer offends, so the
lists only shrink. Entries do not name lines: ``path:name`` (a class, an expression, a
message type), ``path`` relative to the repository root.
"""

from __future__ import annotations

import ast
from collections import Counter
from collections.abc import Iterable, Iterator
from pathlib import Path

import pytest

import minidist

ROOT = Path(minidist.__file__).parent.parent
PACKAGES = ("minidist", "minidist_native")
MAX_CLASS_LINES = 400
# The module that defines the control messages (one typed definition each).
CONTROL_CATALOG = "minidist/messages.py"
READER = "minidist/transport/reader.py"
DOOR = "minidist/door.py"
# what lies behind the session: the door names none of it (the session's methods serve)
BEHIND_THE_SESSION = ("engine", "client", "local_store", "elastic", "p2p", "endpoint",
                      "mailbox")

# --- allowlists: what still offends. Shrink only. ----------------------------------------

# Cycles, each as "module -> module -> ... -> module" from its smallest module name.
ALLOWED_CYCLES: tuple[str, ...] = ()

# "path:Class" of the classes over MAX_CLASS_LINES lines: none is left.
ALLOWED_LONG_CLASSES: tuple[str, ...] = ()

# "path:expression" of each access to a private name of one of minidist's own modules or
# objects (an expression that appears twice in a file is listed twice): none is left.
ALLOWED_PRIVATE_ACCESS: tuple[str, ...] = ()

# Other libraries' private names that minidist relies on, with no public equivalent in
# the versions it supports: the same form, listed apart so that what minidist can fix in
# its own modules stays in ALLOWED_PRIVATE_ACCESS.
FOREIGN_PRIVATE_API: tuple[str, ...] = (
    # a forked rank ends with os._exit (no launcher cleanup), after the atexit handlers
    # the interpreter's own exit would have run
    "minidist/launch/ranks.py:atexit._run_exitfuncs",
    # Ray's key/value store in the GCS (what Ray's own libraries use; no public API)
    "minidist/ray/_bootstrap.py:kv._internal_kv_del",
    "minidist/ray/_bootstrap.py:kv._internal_kv_get",
    "minidist/ray/_bootstrap.py:kv._internal_kv_put",
    # CPython's only report of its small-object pools' free blocks (prefork fills them)
    "minidist/launch/prefork.py:getattr(sys, '_debugmallocstats', None)",
    # a rank forked from a running loop must not inherit it (Python 3.12 does this
    # itself after a fork; 3.11 does not)
    "minidist/restarts.py:asyncio.events._set_running_loop",
    # torch: whether a backend name is registered already; env:// handlers (the public
    # register_rendezvous_handler refuses a scheme that has one); shrink_group's step
    # that wraps the new backend, and the names it gives it; its Work class (public as
    # torch.distributed.Work only in recent torch)
    "minidist/torch/_backend.py:getattr(tdist.Backend, '_plugins', {})",
    "minidist/torch/_rendezvous.py:_rdzv._rendezvous_handlers",
    "minidist/torch/_rendezvous.py:_rdzv._rendezvous_handlers",
    "minidist/torch/_shrink.py:c10d._create_shrunk_process_group",
    "minidist/torch/_shrink.py:getattr(c10d, '_create_shrunk_process_group', None)",
    "minidist/torch/_shrink.py:new_backend._set_group_desc",
    "minidist/torch/_shrink.py:new_backend._set_group_name",
    "minidist/torch/_work.py:torch._C",
    "minidist/torch/_work.py:torch._C._distributed_c10d",
    # gymnasium: the rule by which every vector env batches its envs' infos (a method
    # of VectorEnv with no public counterpart), for batches of any count
    "minidist/gymnasium/_results.py:VectorEnv._add_info",
    "minidist/gymnasium/_results.py:batch._add_info",
    # torch.nn.Module's buffers (a shared module puts its buffers in place)
    "minidist/torch/_shared.py:e.owner._buffers",
    # torch's NCCL bindings and CUDA streams, which minidist_native binds by design
    "minidist_native/_availability.py:hasattr(torch._C, '_nccl_version')",
    "minidist_native/_availability.py:torch._C",
    "minidist_native/_comm.py:_t._C",
    "minidist_native/_comm.py:getattr(torch._C, '_cuda_getCurrentStream', None)",
    "minidist_native/_comm.py:torch._C",
    # ctypes' function pointer type (a type hint)
    "minidist_native/_nccl.py:ctypes._CFuncPtr",
)

# "path:type" of each control-message dict outside the catalog: none is left (every
# message is built from its typed definition).
ALLOWED_CONTROL_DICTS: tuple[str, ...] = ()


# --- reading the source ---------------------------------------------------------------

def _sources() -> dict[str, str]:
    """Every module of the packages: its path (relative to the repository) -> source."""
    out = {}
    for package in PACKAGES:
        for path in sorted((ROOT / package).rglob("*.py")):
            out[path.relative_to(ROOT).as_posix()] = path.read_text()
    return out


def _module_name(path: str) -> str:
    return path.removesuffix(".py").removesuffix("/__init__").replace("/", ".")


def _is_dunder(name: str) -> bool:
    return name.startswith("__") and name.endswith("__")


def _is_private(name: str) -> bool:
    return name.startswith("_") and not _is_dunder(name)


def _check_allowlist(kind: str, found: Iterable[str], allowed: Iterable[str]) -> None:
    """Fails naming the new offenders and the allowlist entries that no longer offend."""
    found, allowed = Counter(found), Counter(allowed)
    new = sorted((found - allowed).elements())
    gone = sorted((allowed - found).elements())
    message = []
    if new:
        message.append(f"{kind}, new offenders:\n  " + "\n  ".join(new))
    if gone:
        message.append(f"{kind}, allowlist entries that no longer offend (remove them):"
                       "\n  " + "\n  ".join(gone))
    assert not message, "\n".join(message)


# --- import cycles ----------------------------------------------------------------------

def imported_modules(source: str, module: str, is_package: bool) -> Iterator[str]:
    """Every absolute module name an import in ``source`` names, at any depth (inside
    functions too), relative imports resolved; ``from a import b`` names ``a`` and
    ``a.b`` (b may be a submodule)."""
    package = module if is_package else module.rpartition(".")[0]
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, ast.Import):
            yield from (a.name for a in node.names)
        elif isinstance(node, ast.ImportFrom):
            if node.level:
                base = package
                for _ in range(node.level - 1):
                    base = base.rpartition(".")[0]
                target = f"{base}.{node.module}" if node.module else base
            else:
                target = node.module or ""
            yield target
            yield from (f"{target}.{a.name}" for a in node.names)


def module_graph(sources: dict[str, str]) -> dict[str, set[str]]:
    """module -> the modules of ``sources`` it imports. Importing a module's own
    ancestor package is not an edge: the package is loaded before the module is."""
    modules = {_module_name(p): p for p in sources}

    def resolve(name: str) -> str | None:
        while name and name not in modules:
            name = name.rpartition(".")[0]
        return name or None

    graph = {}
    for mod, path in modules.items():
        targets = set()
        for name in imported_modules(sources[path], mod, path.endswith("__init__.py")):
            # "a.b.c" loads a, a.b and a.b.c: each is an edge unless it is mod's ancestor
            parts = name.split(".")
            for i in range(1, len(parts) + 1):
                t = resolve(".".join(parts[:i]))
                if t and t != mod and not mod.startswith(t + "."):
                    targets.add(t)
        graph[mod] = targets
    return graph


def find_cycles(graph: dict[str, set[str]]) -> list[str]:
    """One entry per strongly connected set of modules that import each other: a cycle
    through it, written from its smallest module name."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    components: list[set[str]] = []

    def strongconnect(v: str) -> None:  # Tarjan's algorithm
        index[v] = low[v] = len(index)
        stack.append(v)
        on_stack.add(v)
        for w in sorted(graph.get(v, ())):
            if w not in index:
                strongconnect(w)
                low[v] = min(low[v], low[w])
            elif w in on_stack:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            comp = set()
            while True:
                w = stack.pop()
                on_stack.discard(w)
                comp.add(w)
                if w == v:
                    break
            if len(comp) > 1:
                components.append(comp)

    for v in sorted(graph):
        if v not in index:
            strongconnect(v)
    return sorted(_cycle_through(comp, graph) for comp in components)


def _cycle_through(comp: set[str], graph: dict[str, set[str]]) -> str:
    """The shortest cycle from the smallest module of ``comp`` back to itself."""
    start = min(comp)
    paths = {start: [start]}
    frontier = [start]
    while frontier:
        nxt = []
        for v in frontier:
            for w in sorted(graph[v] & comp):
                if w == start:
                    return " -> ".join(paths[v] + [start])
                if w not in paths:
                    paths[w] = paths[v] + [w]
                    nxt.append(w)
        frontier = nxt
    raise AssertionError(f"no cycle through {start}")  # a component always has one


# --- long classes -------------------------------------------------------------------------

def long_classes(source: str, path: str, limit: int = MAX_CLASS_LINES) -> list[str]:
    """``path:Class`` (nested classes dotted) for each class longer than ``limit``."""
    out = []

    def visit(node: ast.AST, prefix: str) -> None:
        for child in ast.iter_child_nodes(node):
            name = prefix
            if isinstance(child, ast.ClassDef):
                name = f"{prefix}{child.name}"
                if child.end_lineno - child.lineno + 1 > limit:
                    out.append(f"{path}:{name}")
                name += "."
            elif isinstance(child, (ast.FunctionDef, ast.AsyncFunctionDef)):
                name = f"{prefix}{child.name}.<locals>."
            visit(child, name)

    visit(ast.parse(source), "")
    return out


# --- private names ----------------------------------------------------------------------

# Underscore names that are their library's documented public API, not private ones.
PUBLIC_UNDERSCORE = frozenset({
    "os._exit",  # the documented way to end a forked child without the parent's cleanup
})
NAMEDTUPLE_API = frozenset({"_replace", "_asdict", "_fields", "_make", "_field_defaults"})
_ATTRIBUTE_CALLS = ("getattr", "hasattr", "setattr", "delattr")


def private_accesses(source: str, path: str) -> list[str]:
    """``path:expression`` for each ``obj._name`` whose ``obj`` is not ``self`` or ``cls``
    (a module counts as an object; ``getattr(obj, "_name")`` and its kin count too), and
    each ``from module import _name``: a private name reached from outside its owner.
    Dunder names are not private, nor a named tuple's methods and
    :data:`PUBLIC_UNDERSCORE`."""
    out = []
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, ast.Attribute):
            name, owner = node.attr, node.value
        elif (isinstance(node, ast.Call) and isinstance(node.func, ast.Name)
              and node.func.id in _ATTRIBUTE_CALLS and len(node.args) >= 2
              and isinstance(node.args[1], ast.Constant)
              and isinstance(node.args[1].value, str)):
            name, owner = node.args[1].value, node.args[0]
        elif isinstance(node, ast.ImportFrom):
            for alias in node.names:
                if _is_private(alias.name) and not _names_a_module(node, alias.name, path):
                    out.append(f"{path}:from {'.' * node.level}{node.module or ''} "
                               f"import {alias.name}")
            continue
        else:
            continue
        if not _is_private(name) or name in NAMEDTUPLE_API:
            continue
        if isinstance(owner, ast.Name) and owner.id in ("self", "cls"):
            continue
        if isinstance(node, ast.Attribute) and ast.unparse(node) in PUBLIC_UNDERSCORE:
            continue
        out.append(f"{path}:{ast.unparse(node)}")
    return out


def _names_a_module(node: ast.ImportFrom, name: str, path: str) -> bool:
    """Whether ``from ... import name`` imports a submodule (a private module of one's
    own package, like ``from . import _backend``, is how a package is put together)."""
    if node.level == 0:
        base = ROOT.joinpath(*(node.module or "").split("."))
    else:
        base = (ROOT / path).parent
        for _ in range(node.level - 1):
            base = base.parent
        if node.module:
            base = base.joinpath(*node.module.split("."))
    # (a C extension of the package, like minidist/shm/_core.c, is one of its modules too)
    return (base / f"{name}.py").is_file() or (base / name / "__init__.py").is_file() \
        or (base / f"{name}.c").is_file()


# --- control-message dicts --------------------------------------------------------------

def control_dicts(source: str, path: str) -> list[str]:
    """``path:type`` for each dict display (or ``dict(t=...)`` call) with a ``"t"`` key
    that is not a number, the shape of a control message; ``type`` is the message's type
    when it is written out, else the expression."""
    out = []
    for node in ast.walk(ast.parse(source)):
        value = None
        if isinstance(node, ast.Dict):
            for key, v in zip(node.keys, node.values):
                if isinstance(key, ast.Constant) and key.value == "t":
                    value = v
        elif (isinstance(node, ast.Call) and isinstance(node.func, ast.Name)
              and node.func.id == "dict"):
            value = next((k.value for k in node.keywords if k.arg == "t"), None)
        if value is None or _is_number(value):
            continue
        kind = value.value if isinstance(value, ast.Constant) else ast.unparse(value)
        out.append(f"{path}:{kind}")
    return out


def _is_number(node: ast.AST) -> bool:
    if isinstance(node, ast.Constant):
        return isinstance(node.value, (int, float, complex)) and not isinstance(node.value,
                                                                              bool)
    if isinstance(node, ast.BinOp):
        return _is_number(node.left) and _is_number(node.right)
    if isinstance(node, ast.UnaryOp):
        return _is_number(node.operand)
    return False


# --- frame headers in the reader --------------------------------------------------------

HEADER_PARSING_NAMES = frozenset({
    "struct", "unpack", "unpack_from", "iter_unpack", "from_bytes", "frombuffer",
    "decode_header", "decode_control_header", "HEADER_SIZE", "CONTROL_HEADER_SIZE",
})


def header_parsing(source: str, path: str) -> list[str]:
    """``path:name`` for each use of a way to read a frame header out of bytes: the
    struct module, unpacking, ``int.from_bytes``, ``np.frombuffer``, the wire's header
    decoders and sizes. The reader moves bytes; the wire's decoder reads headers."""
    out = []
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, ast.Name):
            name = node.id
        elif isinstance(node, ast.Attribute):
            name = node.attr
        elif isinstance(node, ast.Import):
            out += [f"{path}:import {a.name}" for a in node.names
                    if a.name.split(".")[0] in HEADER_PARSING_NAMES]
            continue
        elif isinstance(node, ast.ImportFrom):
            out += [f"{path}:from {node.module} import {a.name}" for a in node.names
                    if a.name in HEADER_PARSING_NAMES
                    or (node.module or "").split(".")[0] in HEADER_PARSING_NAMES]
            continue
        else:
            continue
        if name in HEADER_PARSING_NAMES:
            out.append(f"{path}:{name}")
    return out


def behind_the_session(source: str, path: str) -> list[str]:
    """``path:name`` of each name or attribute of ``BEHIND_THE_SESSION`` in ``source``,
    and ``path:engine`` once if the word appears at all (a docstring, a comment)."""
    out = [f"{path}:engine"] if "engine" in source else []
    for node in ast.walk(ast.parse(source)):
        name = node.attr if isinstance(node, ast.Attribute) else \
            node.id if isinstance(node, ast.Name) else None
        if name in BEHIND_THE_SESSION:
            out.append(f"{path}:{name}")
    return out


# --- the checks ---------------------------------------------------------------------------

SOURCES = _sources()


def test_no_import_cycle_lazy_imports_included():
    _check_allowlist("import cycles", find_cycles(module_graph(SOURCES)), ALLOWED_CYCLES)


def test_no_class_over_400_lines():
    found = [c for path, src in SOURCES.items() for c in long_classes(src, path)]
    _check_allowlist(f"classes over {MAX_CLASS_LINES} lines", found, ALLOWED_LONG_CLASSES)


def test_no_access_to_private_names_of_others():
    found = [a for path, src in SOURCES.items() for a in private_accesses(src, path)]
    _check_allowlist("private names reached from outside", found,
                     ALLOWED_PRIVATE_ACCESS + FOREIGN_PRIVATE_API)


def test_control_message_dicts_only_in_the_catalog():
    found = [d for path, src in SOURCES.items() if path != CONTROL_CATALOG
             for d in control_dicts(src, path)]
    _check_allowlist("control-message dicts outside " + CONTROL_CATALOG, found,
                     ALLOWED_CONTROL_DICTS)


def test_the_reader_parses_no_frame_header():
    found = header_parsing(SOURCES[READER], READER)
    assert not found, "frame-header parsing in the reader:\n  " + "\n  ".join(found)


def test_the_door_talks_only_to_the_session():
    found = behind_the_session(SOURCES[DOOR], DOOR)
    assert not found, "the door reaches past the session:\n  " + "\n  ".join(found)


# --- the checkers find what they look for -------------------------------------------------

def test_find_cycles_finds_a_lazy_cycle_through_relative_imports():
    sources = {
        "p/__init__.py": "",
        "p/a.py": "from . import b\n",
        "p/b.py": "def f():\n    from .c import g\n",
        "p/c.py": "from p.a import x\n",
        "p/d.py": "from .a import y\n",  # into the cycle, not part of it
    }
    graph = module_graph(sources)
    assert graph["p.b"] == {"p.c"}
    assert find_cycles(graph) == ["p.a -> p.b -> p.c -> p.a"]
    assert find_cycles(module_graph({**sources, "p/c.py": "import p\n"})) == []


def test_long_classes_counts_lines_from_class_to_its_end():
    body = "".join(f"    x{i} = {i}\n" for i in range(398))
    assert long_classes("class Short:\n" + body + "    y = 1\n", "m.py") == []  # 400
    long = "def f():\n    class Inner:\n    " + body.replace("\n    ", "\n        ") \
        + "        y = 1\n        z = 2\n"
    assert long_classes("class Long:\n" + body + "    y = 1\n    z = 2\n", "m.py") \
        == ["m.py:Long"]
    assert long_classes(long, "m.py") == ["m.py:f.<locals>.Inner"]


def test_private_accesses_finds_other_objects_and_modules():
    source = (
        "import os\nfrom .x import _helper\nfrom . import _backend\n"
        "class A:\n"
        "    def f(self, other):\n"
        "        self._mine, cls._too, os.__name__ = 1, 2, 3\n"
        "        os._exit(h._replace(seq=1))\n"
        "        getattr(self, '_mine', None), setattr(other, 'public', 1)\n"
        "        return other._theirs + os._fork + self._a._b + _backend.public + \\\n"
        "            getattr(other, '_hidden', None)\n"
    )
    assert sorted(private_accesses(source, "minidist/torch/m.py")) == sorted([
        "minidist/torch/m.py:from .x import _helper", "minidist/torch/m.py:other._theirs",
        "minidist/torch/m.py:os._fork", "minidist/torch/m.py:self._a._b",
        "minidist/torch/m.py:getattr(other, '_hidden', None)"])


def test_control_dicts_finds_messages_not_numbers():
    source = ('a = {"t": "hello", "rank": 1}\nb = dict(t=kind)\n'
              'units = {"k": 1 << 10, "t": 1 << 40}\nc = {"type": "x"}\n')
    assert control_dicts(source, "m.py") == ["m.py:hello", "m.py:kind"]


def test_header_parsing_finds_struct_and_the_wire_decoders():
    source = ("import struct\nfrom minidist.wire import decode_header\n"
              "h = wire.decode_header(buf[:wire.HEADER_SIZE])\n"
              "n = int.from_bytes(buf[2:4], 'little')\n")
    found = header_parsing(source, "r.py")
    for name in ("import struct", "from minidist.wire import decode_header",
                 "decode_header", "HEADER_SIZE", "from_bytes"):
        assert f"r.py:{name}" in found, found
    assert header_parsing("dec.next_event()\n", "r.py") == []


def test_the_allowlist_check_fails_both_ways():
    _check_allowlist("x", ["a", "a", "b"], ["b", "a", "a"])
    with pytest.raises(AssertionError, match=r"new offenders:\n\s+a"):
        _check_allowlist("x", ["a", "a"], ["a"])
    with pytest.raises(AssertionError, match=r"no longer offend.*\n\s+c"):
        _check_allowlist("x", ["a"], ["a", "c"])


def test_behind_the_session_finds_names_attributes_and_words():
    src = ("def f(s):\n"
           "    s.p2p.send()\n"
           "    client = s.session_client\n"  # a local of that name counts too
           "    return client\n")
    assert sorted(behind_the_session(src, "d.py")) == ["d.py:client", "d.py:client",
                                                       "d.py:p2p"]
    assert behind_the_session("x = 1  # the engine\n", "d.py") == ["d.py:engine"]
    assert behind_the_session("def f(s):\n    return s.send_first\n", "d.py") == []
