"""The blocking and asyncio user functions come from one definition each
(minidist.calls, and the collective catalog through minidist.facade): every pair has the
definition's parameters, defaults, annotations and docstring, a hand-edited side fails
here (or refuses to import), and a made function costs no extra Python call."""

from __future__ import annotations

import inspect
import sys
import types

import pytest

import minidist
import minidist.aio as aio
from minidist import api, calls, elastic_api, facade

from . import stubs

DEFINITIONS = {**calls.CALLS, **{c.name: c for c in facade.definitions()}}
HANDLES = {"api": "Work", "aio": "Handle"}


def _defined(c: calls.Call, front: str) -> inspect.Signature:
    """The signature that ``c`` defines for ``front``, from its own source text."""
    made: dict = {}
    exec(compile("from __future__ import annotations\n" + calls.stub(c, HANDLES[front]),
                 "<test>", "exec", dont_inherit=True), vars(api if front == "api" else aio),
         made)
    return inspect.signature(made[c.name])


def _blocking(name: str):
    return getattr(elastic_api if name in api.ELASTIC else api, name)


@pytest.mark.parametrize("name", sorted(DEFINITIONS))
def test_each_pair_has_its_definitions_signature(name):
    c = DEFINITIONS[name]
    for front, fn in (("api", _blocking(name)), ("aio", getattr(aio, name))):
        assert isinstance(fn, types.FunctionType), (front, name)
        assert inspect.signature(fn) == _defined(c, front), (front, name)
        assert fn.__doc__ == c.doc_for(front)
        assert fn.__name__ == fn.__qualname__ == name
    blocking, awaited = inspect.signature(_blocking(name)), inspect.signature(getattr(aio, name))
    assert [(p.name, p.kind, p.default, p.annotation) for p in blocking.parameters.values()] \
        == [(p.name, p.kind, p.default, p.annotation) for p in awaited.parameters.values()]


def test_every_public_function_of_both_front_ends_is_defined_once():
    defined = set(DEFINITIONS)
    public = {n for n in minidist.__all__ if isinstance(getattr(minidist, n), types.FunctionType)}
    # written in one front end only: attach (a door started by a layer above), the store
    # (Store / AsyncStore) and shared_array (minidist.SharedArray is a class)
    assert public - defined == {"get_store"}
    awaited = {n for n in aio.__all__ if isinstance(getattr(aio, n), types.FunctionType)}
    assert awaited - defined == {"get_store", "shared_array"}
    assert defined <= public & awaited


def test_the_package_exports_the_blocking_functions():
    for name in DEFINITIONS:
        assert getattr(minidist, name) is _blocking(name)


def test_a_hand_written_function_that_differs_from_its_definition_fails_to_import():
    c = calls.CALLS["destroy"]
    namespace = {"__name__": "fake", "destroy": lambda timeout=None: None}
    with pytest.raises(TypeError, match="other than its definition"):
        calls.make(namespace, "api", api.SHAPES, "Work", [c])
    ok: dict = {"__name__": "fake"}
    exec("def destroy() -> None:\n    pass\n", ok)
    assert calls.make(ok, "api", api.SHAPES, "Work", [c])["destroy"].__doc__ == c.doc


def test_an_edited_signature_is_seen():
    """What the parametrized test compares against is the definition, not the module."""
    c = calls.CALLS["all_reduce"]
    edited = calls.Call(c.name, c.params.replace("op: ReduceOp = ReduceOp.SUM",
                                                 "op: ReduceOp = ReduceOp.MAX"),
                        c.shape, c.returns, c.doc, c.plan)
    assert _defined(edited, "api") != inspect.signature(api.all_reduce)


def test_a_made_function_has_its_own_frame_and_source():
    code = api.all_reduce.__code__
    assert code.co_name == "all_reduce"
    assert "d.plan.prepare_all_reduce(array, op, group, algorithm)" in inspect.getsource(
        api.all_reduce)
    # what it calls: the door, the planner, the door's wait; no wrapper in between
    assert "door" in code.co_names and "Work" in code.co_names


class _Door:
    """Counts nothing: a stand-in door whose plan returns the call."""

    def __init__(self) -> None:
        self.plan = self

    def prepare_all_reduce(self, *args):
        return args

    def prepare_send(self, *args, **kwargs):
        return args

    def send_again(self, *args):
        return False

    def wait(self, item):
        return None


def test_a_blocking_call_is_one_python_call_deep(monkeypatch):
    d = _Door()
    monkeypatch.setitem(vars(api), "door", lambda: d)
    seen: list[str] = []

    def profile(frame, event, arg):
        if event == "call":
            seen.append(frame.f_code.co_name)

    sys.setprofile(profile)
    try:
        api.all_reduce(None)
        api.send(None, 1)
    finally:
        sys.setprofile(None)
    assert seen == ["all_reduce", "<lambda>", "prepare_all_reduce", "wait",
                    "send", "<lambda>", "send_again", "prepare_send", "wait"]


@pytest.mark.parametrize("name", sorted(stubs.MODULES))
def test_the_type_stubs_declare_the_made_functions(name):
    """Type checkers read minidist/{api,aio,elastic_api}.pyi: they must be what the
    module and the definitions give (rewrite them with `python -m tests.unit.stubs`)."""
    written = stubs.path(name).read_text()
    assert written == stubs.stub(name), f"{stubs.path(name)} is stale: python -m tests.unit.stubs"
    for fn in ("all_reduce", "recv", "scan") if name != "minidist.elastic_api" else ("agree",):
        assert f"def {fn}(" in written


def _global_loads(code: types.CodeType) -> set[str]:
    """The global names ``code`` (and the code nested in it) loads."""
    import dis

    names = {i.argval for i in dis.get_instructions(code) if i.opname == "LOAD_GLOBAL"}
    for const in code.co_consts:
        if isinstance(const, types.CodeType):
            names |= _global_loads(const)
    return names


@pytest.mark.parametrize("module", [api, aio, elastic_api], ids=lambda m: m.__name__)
def test_every_made_function_finds_the_names_it_uses(module):
    """The made functions are compiled from source text (the shapes), which no linter
    reads: every global one of them loads must exist in its module, or the first call
    of that shape raises NameError."""
    made = [fn for fn in vars(module).values()
            if isinstance(fn, types.FunctionType) and fn.__module__ == module.__name__
            and fn.__code__.co_filename.startswith("<")]
    assert len(made) >= (3 if module is elastic_api else 10), f"{module.__name__}: {len(made)}"
    for fn in made:
        missing = {n for n in _global_loads(fn.__code__)
                   if n not in fn.__globals__ and not hasattr(__builtins__, n)
                   and not (isinstance(__builtins__, dict) and n in __builtins__)}
        assert not missing, f"{module.__name__}.{fn.__name__} uses undefined {missing}"
