"""The cost replay: exact on simple cases, cores shared, nodes, the chooser and its
ties, lower bounds, traces, and a calibration that measures something."""

from __future__ import annotations

import json
import math

import pytest

from minidist import calibrate
from minidist.algorithms import Recv, Step, build, cost, schedules, trace
from minidist.algorithms.cost import Costs, replay, replay_call

pytestmark = pytest.mark.timeout(120)

# no cost of the call itself, nor per local operation: the textbook formulas
EXACT = Costs(alpha_s=10e-6, beta_s=1e-9, gamma=0.5e-9, delta=0.25e-9, cores=64, sigma=0.0,
              call_s=0.0)


def test_ring_with_a_core_per_rank_is_the_textbook_formula():
    n, count, itemsize = 4, 4096, 4
    b = count // n * itemsize  # one chunk
    rep = replay_call("all_reduce", "ring", n, count, EXACT)
    want = 2 * (n - 1) * (EXACT.alpha_s + b * EXACT.beta_s) + (n - 1) * b * EXACT.gamma
    assert rep.time == pytest.approx(want, rel=1e-9)
    assert rep.messages == 2 * n * (n - 1) and rep.nbytes == 2 * n * (n - 1) * b
    assert rep.reduced == n * (n - 1) * b


def test_a_chain_of_messages_costs_alpha_and_beta_per_hop():
    rep = replay_call("broadcast", "binomial", 2, 1000, EXACT)
    assert rep.time == pytest.approx(EXACT.alpha_s + 4000 * EXACT.beta_s)


def test_fewer_cores_take_longer_for_the_same_work():
    many = replay_call("all_reduce", "recursive_doubling", 8, 1 << 16, EXACT)
    few = replay_call("all_reduce", "recursive_doubling", 8, 1 << 16,
                      Costs(**{**EXACT.to_dict(), "cores": 2}))
    assert few.time > 3 * many.time
    assert sum(few.busy) == pytest.approx(sum(many.busy))


def test_messages_between_nodes_cost_more():
    one = replay_call("all_reduce", "ring", 8, 1 << 16, EXACT)
    two = replay_call("all_reduce", "ring", 8, 1 << 16, EXACT, nodes=(0,) * 4 + (1,) * 4)
    assert two.time > one.time
    hier = replay_call("all_reduce", "hierarchical", 8, 1 << 16, EXACT,
                       nodes=(0,) * 4 + (1,) * 4)
    # a binomial reduce and broadcast in each node (3 + 3 messages), a ring of 2 leaders
    assert hier.messages == 2 * (3 + 3) + 4


def test_a_schedule_that_cannot_complete_is_refused():
    lonely = [build("all_reduce", "x", 0, 2, 1, 0, [Step((Recv(1, 0, "tmp", 0, 1),))]),
              build("all_reduce", "x", 1, 2, 1, 0, [])]
    with pytest.raises(ValueError, match="rank 0 waits at step 0"):
        replay(lonely)


def test_the_chooser_breaks_ties_by_replay_not_list_order(monkeypatch):
    # n = 4: the closed forms of recursive doubling and the tree are equal on 2 cores
    # (without the call's own cost); the tree reduces less on its critical path, as
    # measured (1.04-1.17x faster from 8 to 54 KiB, docs/performance.md)
    plain = Costs(**{**cost.DEFAULT.to_dict(), "call_s": 0.0})
    for nbytes in (16 << 10, 32 << 10, 64 << 10):
        assert cost.predict("recursive_doubling", 4, nbytes, plain) == pytest.approx(
            cost.predict("tree", 4, nbytes, plain))
        assert cost.estimate("tree", 4, nbytes) < cost.estimate("recursive_doubling", 4,
                                                                 nbytes)
        assert cost.choose(4, nbytes, candidates=cost.CANDIDATES[:-1]) == "tree"
    # truly equal predictions go to the one with fewer messages, whatever the order
    fake = {"ring": (1.0, 12), "tree": (1.0, 6), "recursive_doubling": (2.0, 1)}
    monkeypatch.setattr(cost, "_estimate", lambda a, *args: fake[a])
    monkeypatch.setattr(cost, "predict", lambda *args: 1.0)
    for order in (("ring", "tree", "recursive_doubling"), ("tree", "ring")):
        assert cost.choose(4, 8, candidates=order) == "tree"


def test_large_schedules_fall_back_to_the_closed_form():
    assert cost._ops_estimate("ring", 512, 1 << 20, 1 << 19) > cost.REPLAY_MAX_OPS
    assert cost.estimate("ring", 512, 4 << 20) == cost.predict("ring", 512, 4 << 20)
    assert math.isinf(cost.estimate("ring", 8, 4))  # fewer elements than ranks
    assert math.isinf(cost.estimate("nonsense", 8, 4096))


def test_lower_bounds_and_the_ring_approaching_them():
    n, nbytes = 8, 64 << 20
    b = cost.lower_bounds("all_reduce", n, nbytes, EXACT)
    assert b["latency"] == 3 * EXACT.alpha_s
    assert b["bandwidth"] == pytest.approx(2 * (n - 1) / n * nbytes * EXACT.beta_s)
    assert b["bound"] == pytest.approx(b["bandwidth"] + b["compute"])
    ring = replay_call("all_reduce", "ring", n, nbytes // 4, EXACT).time
    assert 0.95 * ring < b["bound"] <= ring
    small = cost.lower_bounds("all_reduce", n, 8, EXACT)
    assert small["bound"] == small["latency"]
    for algo in ("recursive_doubling", "tree", "rabenseifner", "double_binary_tree"):
        assert replay_call("all_reduce", algo, n, 1 << 14, EXACT).time >= \
            cost.lower_bounds("all_reduce", n, 4 << 14, EXACT)["bound"]


def test_a_chrome_trace_has_a_slice_per_piece_of_work_and_a_flow_per_message():
    rep = replay_call("all_reduce", "ring", 4, 64, EXACT, record=True)
    doc = trace.chrome_trace(rep, title="ring")
    json.dumps(doc)
    events = doc["traceEvents"]
    slices = [e for e in events if e["ph"] == "X"]
    assert {e["cat"] for e in slices} == {"send", "recv", "reduce"}
    assert sum(e["cat"] == "send" for e in slices) == rep.messages
    assert sum(e["ph"] == "s" for e in events) == sum(e["ph"] == "f" for e in events) \
        == rep.messages
    assert {e["tid"] for e in slices} == {0, 1, 2, 3}
    end = max(e["ts"] + e["dur"] for e in slices)
    assert end == pytest.approx(rep.time * 1e6)


def test_every_collective_replays():
    for coll, algo in (("broadcast", "pipeline"), ("all_to_all", "bruck"),
                       ("gather", "binomial"), ("barrier", "dissemination")):
        count = 0 if coll == "barrier" else 64
        assert replay(schedules(coll, algo, 6, count, 0)).time > 0


def test_calibrating_quickly_measures_every_cost():
    c = calibrate.measure(quick=True)
    # beta_m used to come out as the floor 1e-12 when a few noisy calls tipped it
    for name in ("alpha_s", "beta_s", "alpha_m", "beta_m", "gamma", "delta", "sigma"):
        assert getattr(c, name) > 1e-12, (name, c)
    assert c.call_s >= 0
