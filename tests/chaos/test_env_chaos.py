"""Forked children and file-descriptor limits (``env_scenarios.py``), a few trials each;
``benchmarks/chaos.py --scenarios fork_sys_exit,... --trials 20`` runs many."""

from __future__ import annotations

import pytest

from .test_chaos import check

pytestmark = pytest.mark.timeout(200)


@pytest.mark.parametrize("scenario", ["fork_sys_exit", "fork_os_exit", "fork_exception"])
def test_a_forked_child_leaves_its_rank_working(chaos_seed, scenario):
    check(scenario, chaos_seed, 0)


@pytest.mark.parametrize("trial", [0, 3])  # mp_fork, then a child calling minidist
def test_other_children_leave_their_rank_working(chaos_seed, trial):
    check("fork_other", chaos_seed, trial)


@pytest.mark.slow
@pytest.mark.parametrize("trial", [0, 1, 2])
def test_hundreds_of_ranks_under_nofile_limits(chaos_seed, trial):
    check("nofile", chaos_seed, trial)
