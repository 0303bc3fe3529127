"""Containers' limits on shared memory: a job of the RL layout under a 1 MiB, a 64 MiB
(Docker's default) and a full /dev/shm (a mount namespace of its own: skipped where one
cannot be made), on a roomy one, and with ``process_vm_readv`` refused. Every call's
result is checked bit for bit, no rank may die of SIGBUS, and the job's output holds one
warning line when shared memory was short (see ``shm_scenarios.py``)."""

from __future__ import annotations

import pytest

from .scenarios import run
from .shm_scenarios import P2P, SIZES

pytestmark = pytest.mark.timeout(90)


def check(seed: str, trial: int, **fixed: object) -> None:
    t = run("shm_limits", seed, trial, **fixed)
    print(f"\n{t.scenario} seed={t.seed} params={t.params} extra={t.extra} "
          f"in {t.duration:.1f} s")
    if t.skipped:
        pytest.skip(t.skipped)
    assert t.ok, t.report()


@pytest.mark.parametrize("trial,shm,n", [(0, "1m", 4), (1, "64m", 16), (2, "full", 4),
                                         (3, "1m", 16)])
def test_a_small_dev_shm_gives_right_results_and_one_warning(chaos_seed, trial, shm, n):
    check(chaos_seed, trial, shm=shm, n=n)


@pytest.mark.parametrize("trial,shm,n", [(8, "1m", 6), (9, "64m", 16)])
def test_calls_in_flight_at_once_fall_back_together(chaos_seed, trial, shm, n):
    # async_op=True: the fast calls run on threads of their own, the fallbacks on the loop
    check(chaos_seed, trial, shm=shm, n=n, **{"async": True})


def test_a_roomy_dev_shm_still_takes_the_fast_path_without_a_warning(chaos_seed):
    check(chaos_seed, 4, shm="roomy", n=4)


@pytest.mark.parametrize("trial,refuse", [(5, "peers"), (6, "all"), (7, None)])
def test_refused_reads_of_peers_memory_fall_back_on_every_rank(chaos_seed, trial, refuse):
    # 16 ranks: the 16 MiB all_reduces on the world and the workers' groups would read
    # the peers' vectors in place
    check(chaos_seed, trial, shm="roomy", n=16, refuse_reads=refuse, sizes=[4, 16 << 20])


def test_the_scenario_covers_what_the_issue_asks():
    assert SIZES[0] == 4 and SIZES[-1] == 16 << 20 and P2P == 1 << 20
