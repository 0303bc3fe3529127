"""Ranks killed, stopped, leaving early, disagreeing, and a stranger on the node: every
surviving rank must get the right error in seconds, and nothing may be left behind.

One test per trial; each draws its ranks, moment, size and collective from the chaos
seed (see conftest.py). The scenarios themselves live in ``scenarios.py``, shared with
``benchmarks/chaos.py``. Each trial prints its parameters and times (``-s`` shows them).
"""

from __future__ import annotations

import pytest

from .scenarios import MIB16, run

pytestmark = pytest.mark.timeout(120)


def check(scenario: str, seed: str, trial: int, **fixed: object) -> None:
    t = run(scenario, seed, trial, **fixed)
    print(f"\n{t.scenario} seed={t.seed} params={t.params} "
          f"times={[round(x, 2) for x in t.times]} classes={dict(t.classes)}"
          + (f" squatter={t.squatter}" if t.squatter is not None else ""))
    if t.skipped:
        pytest.skip(t.skipped)
    assert t.ok, t.report()


@pytest.mark.parametrize("trial,size", [(0, 4), (1, MIB16), (2, None)])
def test_kill_any_rank_during_collectives(chaos_seed, trial, size):
    check("kill", chaos_seed, trial, **({"size": size} if size else {}))


@pytest.mark.parametrize("trial,how", [(0, "return"), (1, "destroy"), (2, None)])
def test_a_rank_leaving_fails_only_the_ranks_waiting_on_it(chaos_seed, trial, how):
    check("leave", chaos_seed, trial, **({"how": how} if how else {}))


@pytest.mark.parametrize("trial,size", [(0, 4), (1, MIB16)])
def test_stopped_rank_times_out_then_every_call_fails_fast(chaos_seed, trial, size):
    check("stall", chaos_seed, trial, size=size)


@pytest.mark.parametrize("trial,size,n", [(2, 4096, 4), (3, 1 << 20, 3), (4, 20 << 20, 2),
                                          (5, 4, 8)])
def test_a_rank_stopped_mid_call_returns_the_right_bits_or_raises(chaos_seed, trial, size, n):
    # every call's values depend on its number, so a resumed rank that read a slot, a
    # chunk or a peer's vector that the others had rewritten since would be caught; the
    # sizes take the slots, the mid area (1 MiB) and the reads in place (20 MiB)
    check("stall", chaos_seed, trial, size=size, n=n)


@pytest.mark.parametrize("trial,variant", [(0, "stream"), (1, "idle")])
def test_killing_the_launcher_leaves_no_rank(chaos_seed, trial, variant):
    check("launcher_kill", chaos_seed, trial, variant=variant)


@pytest.mark.parametrize("trial", [0, 1])
def test_killing_the_rendezvous_host_under_torchrun(chaos_seed, trial):
    check("host_kill", chaos_seed, trial)


ROOT_CASES = [("broadcast", "self"), ("broadcast", "split"), ("scatter", "self"),
              ("scatter", "split"), ("reduce", "self"), ("gather", "self")]


@pytest.mark.parametrize("op,pattern", ROOT_CASES)
def test_ranks_with_different_roots_all_raise(chaos_seed, op, pattern):
    # self: each rank passes itself as the root (n = 2 or 4); split: rank 0 passes 0, the
    # others 1 (n = 4)
    check("mismatch_root", chaos_seed, ROOT_CASES.index((op, pattern)), op=op,
          pattern=pattern)


def test_ranks_with_different_sizes_all_raise(chaos_seed):
    check("mismatch_size", chaos_seed, 0)


def test_ranks_with_different_algorithms_all_raise(chaos_seed):
    check("mismatch_algorithm", chaos_seed, 0)


@pytest.mark.parametrize("trial", [0, 1])
def test_a_rank_dying_before_init_fails_the_others_init(chaos_seed, trial):
    check("init_death", chaos_seed, trial)


def test_a_second_user_cannot_squat_a_dead_ranks_address(chaos_seed):
    check("squat", chaos_seed, 0)


@pytest.mark.timeout(240)
def test_killed_workers_restart_and_the_learner_never_stops(chaos_seed):
    check("elastic", chaos_seed, 0)
