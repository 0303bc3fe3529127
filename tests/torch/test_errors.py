"""minidist's errors reach torch callers: Work objects that raise, Futures that fail,
group names torch can find, and timeouts per group and per call. In one process (a
world of one) and through the registered backend on 2 and 3 ranks."""

from __future__ import annotations

import concurrent.futures
import datetime

import pytest

torch = pytest.importorskip("torch")

import torch.distributed as tdist  # noqa: E402
from torch.distributed import _functional_collectives as fc  # noqa: E402

import minidist  # noqa: E402
import minidist.torch as dist  # noqa: E402
from minidist.torch._work import Work, seconds  # noqa: E402

from ..processes.harness import LAUNCH_VARS  # noqa: E402
from .jobs import SCRIPTS, run_spawned, torch_env  # noqa: E402


@pytest.fixture
def no_launcher(monkeypatch):
    for var in (*LAUNCH_VARS, "MINIDIST_ADDR", "MINIDIST_TIMEOUT", "GROUP_RANK", "NODE_RANK"):
        monkeypatch.delenv(var, raising=False)


def td(s: float) -> datetime.timedelta:
    return datetime.timedelta(seconds=s)


# ---------------------------------------------------------------------- one process


def test_timeouts_as_seconds_zero_means_do_not_wait():
    assert seconds(None) is None
    assert seconds(td(0)) == 0.0 and seconds(0) == 0.0
    assert seconds(td(2.5)) == 2.5 and seconds(3) == 3.0
    with pytest.raises(ValueError, match=">= 0"):
        seconds(td(-1))
    with pytest.raises(ValueError, match=">= 0"):
        seconds(float("nan"))


def test_work_is_a_torch_work_that_raises_the_minidist_error():
    f = concurrent.futures.Future()
    t = torch.ones(2)
    w = Work([f], None, [t], "all_reduce")
    assert isinstance(w, tdist._Work)
    fut = w.get_future()
    assert isinstance(fut, torch.Future) and not fut.done() and w.get_future() is fut
    with pytest.raises(minidist.DistTimeoutError, match="not done within"):
        w.wait(td(0.05))  # bounds this wait only
    assert not w.is_completed()
    err = minidist.PeerLostError("rank 1 was lost", ranks=[1])
    f.set_exception(err)
    with pytest.raises(minidist.PeerLostError) as caught:
        w.wait()
    assert caught.value is err
    assert w.is_completed() and not w.is_success() and w.exception() is err
    with pytest.raises(RuntimeError, match="PeerLostError: rank 1 was lost"):
        fut.wait()  # torch Futures carry errors as text, which C++ (DDP) reads too
    assert fut.done()

    f = concurrent.futures.Future()
    w = Work([f], None, [t], "all_reduce")
    f.set_result(None)
    assert w.wait(td(0)) and w.is_success() and w.exception() is None
    assert w.get_future().wait() == [t] and w.result() == [t]


def test_registered_backend_names_groups_and_takes_timeouts(no_launcher):
    tdist.init_process_group("minidist", store=tdist.HashStore(), rank=0, world_size=1,
                             timeout=td(7))
    try:
        world = tdist.group.WORLD
        assert world.group_name and world.timeout == td(7)
        g = tdist.new_group([0], backend="minidist", group_desc="mine")
        assert g.group_name and g.group_name != world.group_name
        assert g.group_desc == "mine" and g.timeout == td(7)  # the default group's
        assert g.group_name in repr(g)
        t = fc.all_reduce(torch.ones(3), "sum", g)
        assert torch.equal(t, torch.ones(3))
        tdist.destroy_process_group(g)
        now = tdist.new_group([0], backend="minidist", timeout=td(0))
        assert now.timeout == td(0)
        t = torch.ones(2)
        tdist.all_reduce(t, group=now)  # nothing to wait for: done at once
        assert torch.equal(t, torch.ones(2))
        now.set_timeout(td(4))
        world.set_timeout(td(5))
        assert now.timeout == td(4) and world.timeout == td(5)
        tdist.all_reduce(t)
    finally:
        tdist.destroy_process_group()
    assert not minidist.is_initialized()


def test_drop_in_groups_take_timeouts(no_launcher):
    dist.init_process_group("gloo", timeout=td(0))  # joining still has time
    try:
        assert dist.new_group([0]).timeout == 0.0  # init_process_group's
        assert dist.new_group([0], timeout=td(3)).timeout == 3.0
        assert tdist.group.WORLD.timeout == td(0)  # torch's mirror of the world
        t = torch.ones(2)
        dist.all_reduce(t)
        assert torch.equal(t, torch.ones(2))
        with pytest.raises(ValueError, match=">= 0"):
            dist.new_group([0], timeout=-1)
    finally:
        dist.destroy_process_group()


# ---------------------------------------------------------------------- 2 and 3 ranks

GONE_CHECKS = ("all_reduce", "broadcast", "recv", "barrier", "async_wait", "async_future",
               "ddp_backward")
TIMEOUT_CHECKS = ("names", "mismatch", "wait_timeout")
RANK0_CHECKS = ("barrier_timeout", "timeout_zero", "group_timeout", "world_timeout")


@pytest.mark.timeout(150)
@pytest.mark.parametrize("n, mode", [(2, "exit"), (2, "kill"), (3, "kill")])
def test_peer_that_leaves_makes_every_call_raise(n, mode):
    """The last rank returns (exit) or is killed (kill): on every other rank
    all_reduce, broadcast, recv, barrier, an async wait, a Future and DDP's backward
    raise (PeerLostError, or DistTimeoutError after MINIDIST_TIMEOUT)."""
    results = run_spawned(n, SCRIPTS / "peer_exit.py", mode, timeout=100,
                          env=torch_env(MINIDIST_TIMEOUT="10"))
    for r, p in enumerate(results[:-1]):
        assert p.returncode == 0, (r, p.stdout[-2000:], p.stderr[-4000:])
        for check in GONE_CHECKS:
            assert f"rank {r}: OK {check}" in p.stdout, (r, check, p.stdout[-2000:])
        assert f"rank {r}: done" in p.stdout
    assert results[-1].returncode == (-9 if mode == "kill" else 0), results[-1].stderr[-3000:]


@pytest.mark.timeout(150)
def test_timeouts_mismatches_and_group_names():
    """2 ranks: names, shape mismatch (both ranks), a wait with its own timeout; rank 0
    alone: barrier(timeout=), timeout 0, a new_group timeout (3 s) and
    init_process_group's (5 s) while MINIDIST_TIMEOUT is 60 s."""
    results = run_spawned(2, SCRIPTS / "timeouts.py", timeout=100,
                          env=torch_env(MINIDIST_TIMEOUT="60"))
    for r, p in enumerate(results):
        assert p.returncode == 0, (r, p.stdout[-2000:], p.stderr[-4000:])
        for check in TIMEOUT_CHECKS + (RANK0_CHECKS if r == 0 else ()):
            assert f"rank {r}: OK {check}" in p.stdout, (r, check, p.stdout[-2000:])
        assert f"rank {r}: done" in p.stdout


PATH_CHECKS = ("device_types", "all_gather_coalesced", "coalescing_manager",
               "sparse_all_reduce", "any_source", "monitored_barrier", "timeout_wording")


@pytest.mark.timeout(150)
def test_torch_code_paths_on_three_ranks():
    """3 ranks: the CPU device association torch looks up, all_gather_coalesced, the
    coalescing manager, sparse all_reduce, receives from any source (also on a
    subgroup), monitored_barrier in gloo's words (through the process group and
    minidist.torch) and timeouts in torch's words."""
    results = run_spawned(3, SCRIPTS / "torch_paths.py", timeout=120,
                          env=torch_env(MINIDIST_TIMEOUT="60"))
    for r, p in enumerate(results):
        assert p.returncode == 0, (r, p.stdout[-2000:], p.stderr[-4000:])
        for check in PATH_CHECKS:
            assert f"rank {r}: OK {check}" in p.stdout, (r, check, p.stdout[-2000:])
        assert f"rank {r}: done" in p.stdout
