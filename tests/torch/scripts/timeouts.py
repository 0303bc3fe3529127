"""Errors and timeouts through the registered backend, on 2 ranks: group names
(destroy_process_group of a subgroup, functional collectives), shape mismatches, a wait
and a barrier with their own timeout, a group's timeout, timeout 0, and
init_process_group's timeout.

``timeouts.py`` in a torchrun-like environment. Each rank prints ``rank R: OK <check>``
per check, then ``rank R: done``.
"""

from __future__ import annotations

import datetime
import time

import torch
import torch.distributed as tdist
from torch.distributed import _functional_collectives as fc

import minidist
import minidist.torch  # noqa: F401  (registers the backend)

WORLD_TIMEOUT = 5.0  # init_process_group's (MINIDIST_TIMEOUT is larger)
GROUP_TIMEOUT = 3.0


def seconds(s: float) -> datetime.timedelta:
    return datetime.timedelta(seconds=s)


def raises(cls: type, call) -> tuple[BaseException, float]:
    """The error of ``call`` (it must raise ``cls``) and how long it took."""
    t0 = time.monotonic()
    try:
        call()
    except cls as e:
        return e, time.monotonic() - t0
    except Exception as e:
        raise AssertionError(f"expected {cls.__name__}, got {type(e).__name__}: {e}") from e
    raise AssertionError(f"expected {cls.__name__}; the call returned normally")


def main() -> None:
    torch.set_num_threads(1)
    tdist.init_process_group("minidist", timeout=seconds(WORLD_TIMEOUT))
    r, n = tdist.get_rank(), tdist.get_world_size()
    assert n == 2
    other = 1 - r

    def ok(check: str) -> None:
        print(f"rank {r}: OK {check}", flush=True)

    # groups are named; the name finds the group (functional collectives, destroy)
    sync = tdist.new_group([0, 1], backend="minidist", timeout=seconds(60))
    sub = tdist.new_group([0, 1], backend="minidist", group_desc="sub")
    assert tdist.group.WORLD.group_name and sub.group_name, (tdist.group.WORLD, sub)
    assert sub.group_name != sync.group_name and sub.group_desc == "sub", sub.group_desc
    got = fc.all_reduce(torch.full((3,), float(r + 1)), "sum", sub)
    assert torch.equal(got, torch.full((3,), 3.0)), got
    got = fc.all_reduce(torch.ones(2), "sum", tdist.group.WORLD)
    assert torch.equal(got, torch.full((2,), 2.0)), got
    tdist.destroy_process_group(sub)
    assert sub not in tdist.distributed_c10d._world.pg_map
    ok("names")

    # shapes that disagree (4 vs 5 floats): both ranks raise, sync and async
    g = tdist.new_group([0, 1], backend="minidist")
    t = torch.full((4 + r,), 7.0)
    raises(minidist.CollectiveMismatchError, lambda: tdist.all_reduce(t, group=g))
    assert (t == 7).all(), t
    g = tdist.new_group([0, 1], backend="minidist")
    w = tdist.all_reduce(torch.ones(4 + r), group=g, async_op=True)
    fut = w.get_future()
    raises(minidist.CollectiveMismatchError, w.wait)
    assert w.is_completed() and not w.is_success()
    assert isinstance(w.exception(), minidist.CollectiveMismatchError), w.exception()
    e, _ = raises(RuntimeError, fut.wait)
    assert "CollectiveMismatchError" in str(e), e
    ok("mismatch")

    # a wait with its own timeout: DistTimeoutError, and the call goes on
    g = tdist.new_group([0, 1], backend="minidist")
    if r == 0:
        t = torch.ones(3)
        w = tdist.all_reduce(t, group=g, async_op=True)
        _, took = raises(minidist.DistTimeoutError, lambda: w.wait(seconds(0.3)))
        assert took < 2.0, took
        tdist.barrier(group=sync)  # now rank 1 joins the all_reduce
        w.wait()
        assert torch.equal(t, torch.full((3,), 2.0)), t
    else:
        tdist.barrier(group=sync)
        tdist.all_reduce(torch.ones(3), group=g)
    ok("wait_timeout")

    # timeouts bound calls that cannot finish: rank 1 makes none of them
    slow = tdist.new_group([0, 1], backend="minidist", timeout=seconds(GROUP_TIMEOUT))
    never = tdist.new_group([0, 1], backend="minidist", timeout=datetime.timedelta(0))
    bar = tdist.new_group([0, 1], backend="minidist")
    if r == 0:
        _, took = raises(minidist.DistTimeoutError,
                         lambda: tdist.barrier(group=bar, timeout=seconds(0.3)))
        assert took < 2.0, took
        ok("barrier_timeout")
        _, took = raises(minidist.DistTimeoutError,
                         lambda: tdist.all_reduce(torch.ones(3), group=never))
        assert took < 1.5, took
        ok("timeout_zero")
        t0 = time.monotonic()
        on_slow = tdist.all_reduce(torch.ones(3), group=slow, async_op=True)
        on_world = tdist.broadcast(torch.ones(3), src=other, async_op=True)
        raises(minidist.DistTimeoutError, on_slow.wait)
        took = time.monotonic() - t0
        assert GROUP_TIMEOUT - 0.5 < took < WORLD_TIMEOUT - 0.5, took
        ok("group_timeout")
        raises(minidist.DistTimeoutError, on_world.wait)
        took = time.monotonic() - t0
        assert WORLD_TIMEOUT - 0.5 < took < WORLD_TIMEOUT + 5, took
        ok("world_timeout")
    tdist.barrier(group=sync)
    tdist.destroy_process_group()
    print(f"rank {r}: done", flush=True)


if __name__ == "__main__":
    main()
