"""Algorithms of your own: register(), wire indices, the checks on what a function
returns, simulate() with a function, modules of algorithms (MINIDIST_ALGO_MODULE)."""

from __future__ import annotations

import dataclasses
import sys
import textwrap

import numpy as np
import pytest

import minidist.algorithms as algos
from minidist import env, wire
from minidist.algorithms import (
    ALGORITHMS,
    USER_INDEX_BASE,
    Schedule,
    ScheduleError,
    Step,
    make_schedule,
    name_of,
    plugins,
    register,
    registered,
    simulate,
    unregister,
    wire_index,
)
from minidist.algorithms.simulator import SimulationError
from minidist.ops import ReduceOp
from minidist.plan import Planner

pytestmark = pytest.mark.timeout(60)


def swap_tree(rank: int, size: int, count: int, root: int = 0) -> Schedule:
    """A user algorithm: the built-in tree under another name."""
    return make_schedule("all_reduce", "tree", rank, size, count)


@pytest.fixture
def clean_registry():
    """Forget every algorithm a test registers."""
    before = {c: set(names) for c, names in ALGORITHMS.items()}
    yield
    for c, names in list(ALGORITHMS.items()):
        for a in names:
            if a not in before[c]:
                unregister(c, a)


def test_register_makes_a_function_usable_by_name(clean_registry):
    register("all_reduce", "mine", swap_tree)
    assert ALGORITHMS["all_reduce"][-1] == "mine"
    s = make_schedule("all_reduce", "mine", 1, 4, 8)
    assert s.algorithm == "mine"  # renamed to what it is registered as
    inputs = [np.full(8, r + 1.0) for r in range(5)]
    assert all(np.array_equal(o, np.full(8, 15.0)) for o in simulate("all_reduce", "mine",
                                                                       inputs))
    assert registered("all_reduce")["all_reduce"] == {"mine": f"{__name__}.swap_tree"}
    unregister("all_reduce", "mine")
    assert "mine" not in ALGORITHMS["all_reduce"]
    with pytest.raises(ValueError, match="register"):
        make_schedule("all_reduce", "mine", 0, 2, 4)


def test_decorator_form_and_idempotence(clean_registry):
    @register("broadcast", "mine_bcast")
    def mine_bcast(rank, size, count, root=0):
        return make_schedule("broadcast", "binomial", rank, size, count, root)

    register("broadcast", "mine_bcast", mine_bcast)  # the same function again: fine
    out = simulate("broadcast", "mine_bcast", [np.arange(5.0) * (r == 2) for r in range(4)],
                   root=2)
    assert all(np.array_equal(o, np.arange(5.0)) for o in out)


def test_wire_index_is_a_digest_of_the_name_not_the_order(clean_registry):
    register("all_reduce", "zeta", swap_tree)
    register("all_reduce", "alpha", swap_tree)
    z, a = wire_index("all_reduce", "zeta"), wire_index("all_reduce", "alpha")
    unregister("all_reduce", "zeta")
    unregister("all_reduce", "alpha")
    register("all_reduce", "alpha", swap_tree)  # the other order
    register("all_reduce", "zeta", swap_tree)
    assert (wire_index("all_reduce", "zeta"), wire_index("all_reduce", "alpha")) == (z, a)
    assert USER_INDEX_BASE <= min(z, a) and max(z, a) < 254  # 254, 255: minidist's own
    assert name_of("all_reduce", z) == "zeta" and name_of("all_reduce", 250 if z != 250
                                                          and a != 250 else 251) is None
    # built-ins keep their positions: the wire format of every existing algorithm
    assert [wire_index("all_reduce", x) for x in ALGORITHMS["all_reduce"][:5]] == \
        [0, 1, 2, 3, 4]


def test_names_whose_digests_collide_are_refused(clean_registry):
    seen: dict[int, str] = {}
    for i in range(2000):
        name = f"alg{i}"
        index = algos.registry.digest_index("reduce", name)
        if index in seen:
            register("reduce", seen[index], swap_tree)
            with pytest.raises(ValueError, match="same wire index"):
                register("reduce", name, swap_tree)
            return
        seen[index] = name
    pytest.fail("no collision found")


@pytest.mark.parametrize(("args", "match"), [
    (("allreduce", "x", swap_tree), "unknown collective"),
    (("all_reduce", "ring", swap_tree), "built in"),
    (("all_reduce", "two words", swap_tree), "bad algorithm name"),
    (("all_reduce", "", swap_tree), "bad algorithm name"),
    (("all_reduce", "x", 42), "needs a function"),
])
def test_register_refuses(args, match, clean_registry):
    with pytest.raises(ValueError, match=match):
        register(*args)


def test_a_name_taken_by_another_function_needs_replace(clean_registry):
    register("all_reduce", "mine", swap_tree)
    with pytest.raises(ValueError, match="already registered"):
        register("all_reduce", "mine", lambda r, s, c, root=0: swap_tree(r, s, c))
    register("all_reduce", "mine", lambda r, s, c, root=0: swap_tree(r, s, c), replace=True)
    assert make_schedule("all_reduce", "mine", 0, 2, 3).algorithm == "mine"


def bad_type(rank, size, count, root=0):
    return [rank]


def bad_count(rank, size, count, root=0):
    return make_schedule("all_reduce", "ring", rank, size, count + 1)


def bad_bounds(rank, size, count, root=0):
    s = make_schedule("all_reduce", "ring", rank, size, count)
    st = s.steps[0]
    send = st.comms[0]
    broken = dataclasses.replace(send, hi=count + 5)
    return dataclasses.replace(s, steps=(Step((broken, *st.comms[1:]), st.compute),
                                         *s.steps[1:]))


@pytest.mark.parametrize(("fn", "match"), [
    (bad_type, "returned list, not a Schedule"),
    (bad_count, r"count=5 \(asked 4\)"),
    (bad_bounds, r"step 0: out\[.*out of range"),
])
def test_what_a_function_returns_is_checked(fn, match, clean_registry):
    register("all_reduce", "broken", fn)
    with pytest.raises(ScheduleError, match=match) as info:
        make_schedule("all_reduce", "broken", 1, 3, 4)
    assert info.value.rank == 1
    if fn is bad_bounds:
        assert info.value.step == 0
    # simulate() with the function itself reports the same, as a SimulationError
    with pytest.raises(SimulationError, match=match):
        simulate("all_reduce", fn, [np.zeros(4)] * 3)


def test_simulate_takes_a_function():
    out = simulate("all_reduce", swap_tree, [np.full(3, float(r)) for r in range(6)])
    assert all(np.array_equal(o, np.full(3, 15.0)) for o in out)


def test_the_planner_sends_a_registered_algorithms_digest_and_names_unknown_ones(
        clean_registry):
    register("all_reduce", "mine", swap_tree)
    plan = Planner(0, 4, lambda g: 7, lambda g, p, t, s: 0, False, algos.cost.DEFAULT, {})
    prepared = plan.prepare_all_reduce(np.zeros(8, np.float32), ReduceOp.SUM, None, "mine")
    assert prepared.call.algorithm == wire_index("all_reduce", "mine")
    assert prepared.call.algorithm_name == "mine"
    assert "algorithm='mine'" in prepared.call.describe()
    # a frame from a rank running an algorithm this rank never registered
    h = wire.Header(wire.Kind.ALL_REDUCE, prepared.call.dtype, 0, 201, 0, 7, 1, -1, 0, 0, 8, 32)
    assert "not registered here (wire index 201)" in prepared.call.describe(h)
    with pytest.raises(ValueError, match="MINIDIST_ALGO_MODULE"):
        plan.prepare_all_reduce(np.zeros(8, np.float32), ReduceOp.SUM, None, "theirs")


def test_algorithm_modules_from_the_environment():
    assert env.algorithm_modules({}) == []
    assert env.algorithm_modules({"MINIDIST_ALGO_MODULE": "a, b.c,"}) == ["a", "b.c"]


MODULE = '''
from minidist.algorithms import Schedule, make_schedule, register


def doubled(rank: int, size: int, count: int, root: int = 0) -> Schedule:
    return make_schedule("all_reduce", "recursive_doubling", rank, size, count)


def chain(rank, size, count, root=0):
    return make_schedule("broadcast", "pipeline", rank, size, count, root)


def helper(x):
    return x * 2


def not_a_schedule(rank, size, count, root=0):
    return [rank, size]


register("all_reduce", "explicit", lambda r, s, c, root=0: doubled(r, s, c))
'''


def test_a_module_of_algorithms(tmp_path, monkeypatch, clean_registry):
    (tmp_path / "my_algos_a.py").write_text(MODULE)
    monkeypatch.syspath_prepend(str(tmp_path))
    got = plugins.load_module("my_algos_a")
    assert set(got) == {("all_reduce", "doubled"), ("broadcast", "chain"),
                        ("all_reduce", "explicit")}
    assert plugins.load_module("my_algos_a") == got  # twice: harmless
    assert "helper" not in ALGORITHMS["all_reduce"]
    assert plugins.resolve("all_reduce", "my_algos_a:doubled") == "doubled"
    assert plugins.resolve("all_reduce", "ring") == "ring"
    with pytest.raises(ValueError, match="broadcast algorithm, not a all_reduce"):
        plugins.resolve("all_reduce", "my_algos_a:chain")
    with pytest.raises(ValueError, match="no function"):
        plugins.resolve("all_reduce", "my_algos_a:nothing")
    sys.modules.pop("my_algos_a", None)


def test_module_errors(tmp_path, monkeypatch, clean_registry):
    monkeypatch.syspath_prepend(str(tmp_path))
    with pytest.raises(ImportError, match="cannot import algorithm module 'no_such_mod'"):
        plugins.load_module("no_such_mod")
    (tmp_path / "my_algos_b.py").write_text(textwrap.dedent('''
        from minidist.algorithms import Schedule
        def broken(rank: int, size: int, count: int, root: int = 0) -> Schedule:
            raise KeyError("oops")
    '''))
    with pytest.raises(ValueError, match="says it returns a Schedule but raised KeyError"):
        plugins.load_module("my_algos_b")
    (tmp_path / "my_algos_c.py").write_text(textwrap.dedent('''
        from minidist.algorithms import make_schedule
        def ring(rank, size, count, root=0):
            return make_schedule("all_reduce", "tree", rank, size, count)
    '''))
    with pytest.raises(ValueError, match="name of a built-in all_reduce algorithm"):
        plugins.load_module("my_algos_c")
    for m in ("my_algos_b", "my_algos_c"):
        sys.modules.pop(m, None)


def test_a_module_in_the_current_directory(tmp_path, monkeypatch, clean_registry):
    (tmp_path / "my_algos_d.py").write_text(MODULE)
    monkeypatch.chdir(tmp_path)
    monkeypatch.setattr(sys, "path", [p for p in sys.path if p not in ("", ".")])
    assert ("all_reduce", "doubled") in plugins.load_module("my_algos_d")
    assert "" not in sys.path  # found like python -m finds it, and put back
    sys.modules.pop("my_algos_d", None)
