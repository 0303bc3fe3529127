"""The choosers given a cost model (no timing): all_to_all follows the replay (Bruck's
few messages for small blocks, pairwise's single copy of each block for large ones),
the replay charges a call's own cost and each local operation, and the calibration
inverts the replay."""

from __future__ import annotations

import pytest

from minidist import algorithms, calibrate
from minidist.algo_cli import minidist_choice
from minidist.algorithms import cost, schedules
from minidist.algorithms.cost import Costs, replay, replay_call

pytestmark = pytest.mark.timeout(120)

# this project's 2-core machine, calibrated (minidist calibrate, quiet, 4 ranks)
MACHINE = Costs(alpha_s=60e-6, beta_s=0.4e-9, gamma=0.09e-9, delta=0.13e-9, sigma=1e-6,
                call_s=80e-6, cores=2)


@pytest.mark.parametrize("n", [4, 8])
def test_all_to_all_takes_bruck_for_small_blocks_and_pairwise_for_large(n):
    for c in (cost.DEFAULT, MACHINE):
        for count in (1, 16, 256):  # 4 B .. 1 KiB per block
            assert cost.choose_replayed("all_to_all", n, count, c) == "bruck"
            assert minidist_choice("all_to_all", n, count, "float32", c) == "bruck"
        for count in (64 << 10, 1 << 20):  # 256 KiB, 4 MiB per block
            assert cost.choose_replayed("all_to_all", n, count, c) == "pairwise"
            assert minidist_choice("all_to_all", n, count, "float32", c) == "pairwise"


def test_the_all_to_all_choice_is_the_least_replayed_time():
    for n in (3, 4, 5, 8, 12):
        for count in (1, 100, 1000, 10_000, 100_000):
            times = {a: replay_call("all_to_all", a, n, count, MACHINE).time
                     for a in cost.ALL_TO_ALL_CANDIDATES}
            chosen = cost.choose_replayed("all_to_all", n, count, MACHINE)
            assert times[chosen] == min(times.values()), (n, count, times)


def test_two_ranks_tie_and_the_tie_goes_to_fewer_messages_then_the_first_listed():
    # n = 2: Bruck is one exchange, like pairwise, plus its copies
    assert cost.choose_replayed("all_to_all", 2, 1, MACHINE) == "pairwise"
    free = Costs(alpha_s=1e-5, beta_s=0, gamma=0, delta=0, sigma=0, cores=64, call_s=0)
    for order in (("pairwise", "bruck"), ("bruck", "pairwise")):
        assert cost.choose_replayed("all_to_all", 2, 8, free, order) == order[0]
    with pytest.raises(ValueError):
        cost.choose_replayed("all_to_all", 4, 8, free, ())


def test_bruck_pays_for_its_copies():
    # the same messages' worth of time with free copies; each copy costs sigma + delta/B
    free = Costs(**{**MACHINE.to_dict(), "delta": 0.0, "sigma": 0.0})
    for n, count in ((8, 1), (8, 1 << 16)):
        paid = replay_call("all_to_all", "bruck", n, count, MACHINE)
        unpaid = replay_call("all_to_all", "bruck", n, count, free)
        assert paid.time > unpaid.time and paid.copied == unpaid.copied > 0
    # many small copies: their fixed cost alone makes a difference
    ops = sum(len(st.compute) for st in schedules("all_to_all", "bruck", 8, 1)[0].steps)
    assert ops > 8
    only_sigma = Costs(alpha_s=0, beta_s=0, gamma=0, delta=0, sigma=1e-6, cores=64,
                       call_s=0)
    assert replay_call("all_to_all", "bruck", 8, 1, only_sigma).time == pytest.approx(
        ops * 1e-6)


def test_the_closed_form_of_all_to_all_is_the_replay_on_one_node():
    for c in (cost.DEFAULT, MACHINE, Costs(cores=64)):
        for n in (2, 3, 4, 5, 8, 12, 16):
            # exact when the ranks share the cores evenly; else within a turn's rounding
            rel = 1e-6 if n % c.cores == 0 or n <= c.cores else 0.1
            for count in (1, 1000, 100_000):
                for a in cost.ALL_TO_ALL_CANDIDATES:
                    want = replay_call("all_to_all", a, n, count, c).time
                    assert cost.predict_all_to_all(a, n, count, c) == pytest.approx(
                        want, rel=rel), (a, n, count)
    # large groups are not replayed, yet chosen the same way
    assert cost._schedule_ops("all_to_all", "pairwise", 256, 1) > cost.REPLAY_QUICK_OPS
    assert cost.choose_replayed("all_to_all", 256, 1, MACHINE) == "bruck"
    assert cost.choose_replayed("all_to_all", 256, 1 << 16, MACHINE) == "pairwise"


def test_the_default_all_to_all_follows_the_replay():
    assert algorithms.choose("all_to_all", 8, 8 * 4, count=1) == "bruck"
    assert algorithms.choose("all_to_all", 8, 8 * 4 << 20, count=1 << 20) == "pairwise"
    assert algorithms.choose("all_to_all", 8, 8 * 4) == "bruck"


def test_a_call_costs_every_rank_call_s_first():
    base = Costs(alpha_s=10e-6, beta_s=0, gamma=0, delta=0, sigma=0, cores=64, call_s=0)
    with_call = Costs(**{**base.to_dict(), "call_s": 50e-6})
    for algo in ("recursive_doubling", "tree", "ring"):
        a = replay_call("all_reduce", algo, 4, 4, base).time
        b = replay_call("all_reduce", algo, 4, 4, with_call).time
        assert b == pytest.approx(a + 50e-6)
    # on shared cores the ranks' calls queue up: 4 ranks on 2 cores take 2 turns
    shared = Costs(**{**with_call.to_dict(), "alpha_s": 0.0, "cores": 2})
    assert replay(schedules("all_reduce", "recursive_doubling", 4, 4), shared).time == \
        pytest.approx(100e-6)


def test_the_all_reduce_choice_at_four_ranks_on_this_machine():
    # what `minidist bench all_reduce -n 4 --algorithm all --predict` measured (docs/
    # performance.md): a tree below ~64 KiB, the shared-memory path above ~256 KiB
    counts = [1, 6, 45, 304, 2048, 13777, 92682, 623487, 4194304]
    picks = [minidist_choice("all_reduce", 4, k, "float32", MACHINE) for k in counts]
    assert picks[:6] == ["tree"] * 6
    assert picks[6:] == ["shared_memory"] * 3


def test_the_calibration_inverts_the_replay():
    # a timing job's CPU per call made up by the replay from known costs: _fit finds them
    true = Costs(alpha_s=55e-6, beta_s=0.35e-9, gamma=0.09e-9, delta=0.12e-9, sigma=1e-6,
                 call_s=80e-6, cores=calibrate.RANKS)
    found = {}
    for name, algo, count in calibrate.cases(quick=True):
        busy = replay(schedules("all_reduce", algo, calibrate.RANKS, count), true).busy
        cpu = sum(busy) / len(busy)  # call_s included
        found[name] = {"wall": 2 * cpu, "cpu": cpu, "count": count}
    fit = calibrate._fit(found, true.gamma, true.sigma, 0.05e-9)
    for name in ("alpha_s", "call_s", "beta_s", "delta"):
        # (a few bytes' worth of beta_s and delta blur alpha_s and call_s a little)
        assert fit[name] == pytest.approx(getattr(true, name), rel=1e-3), name
    assert fit["alpha_m"] > 0 and fit["beta_m"] > 0
