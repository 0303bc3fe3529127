"""What torch's own code paths need from the "minidist" backend, on 3 ranks: the CPU
device association (``_device_types``, ``_get_backend``), all_gather_coalesced, the
coalescing manager, sparse all_reduce, receives from any source, monitored_barrier with
gloo's wording (through the process group and through ``minidist.torch``), and timeouts
worded as torch's backends word them.

``torch_paths.py`` in a torchrun-like environment. Each rank prints ``rank R: OK <check>``
per check, then ``rank R: done``.
"""

from __future__ import annotations

import datetime
import time

import torch
import torch.distributed as tdist
from torch.distributed.distributed_c10d import _coalescing_manager

import minidist
import minidist.torch as mdt


def seconds(s: float) -> datetime.timedelta:
    return datetime.timedelta(seconds=s)


def raises(cls: type, call, match: str = "") -> BaseException:
    try:
        call()
    except cls as e:
        assert match in str(e), (match, str(e))
        return e
    except Exception as e:
        raise AssertionError(f"expected {cls.__name__}, got {type(e).__name__}: {e}") from e
    raise AssertionError(f"expected {cls.__name__}; the call returned normally")


def main() -> None:
    torch.set_num_threads(1)
    tdist.init_process_group("minidist")
    r, n = tdist.get_rank(), tdist.get_world_size()
    assert n == 3
    world = tdist.group.WORLD
    sync = tdist.new_group(backend="minidist")

    def ok(check: str) -> None:
        print(f"rank {r}: OK {check}", flush=True)

    # the backend serves the CPU device, as torch looks it up
    assert world._device_types == [torch.device("cpu")], world._device_types
    assert world._get_backend(torch.device("cpu")) is world
    raises(RuntimeError, lambda: world._get_backend(torch.device("cuda")), "cuda")
    assert tdist.distributed_c10d._get_object_coll_device(world) == "cpu"
    ok("device_types")

    # all_gather_coalesced: output_lists[j][i] = rank j's input i (complex as well)
    ins = [torch.full((2,), float(r)), torch.full((3, 1), complex(r, 1))]
    outs = [[torch.empty_like(t) for t in ins] for _ in range(n)]
    tdist.all_gather_coalesced(outs, ins)
    for j in range(n):
        assert torch.equal(outs[j][0], torch.full((2,), float(j))), outs
        assert torch.equal(outs[j][1], torch.full((3, 1), complex(j, 1))), outs
    fut = tdist.all_gather_coalesced(outs, ins, async_op=True)
    fut.wait()
    ok("all_gather_coalesced")

    # the coalescing manager, with a device: every call started, one wait for all
    ts = [torch.full((4,), float(r + i)) for i in range(3)]
    with _coalescing_manager(world, torch.device("cpu"), async_ops=True) as cm:
        for t in ts:
            tdist.all_reduce(t)
        b = torch.full((2,), float(r))
        tdist.broadcast(b, src=1)
    cm.wait()
    for i, t in enumerate(ts):
        assert torch.equal(t, torch.full((4,), float(sum(range(n)) + n * i))), (i, t)
    assert torch.equal(b, torch.full((2,), 1.0)), b
    # and without a device (all_reduce's fast path: allreduce_coalesced)
    ts = [torch.ones(3) * (r + 1), torch.ones(1) * 2]
    with _coalescing_manager(world):
        for t in ts:
            tdist.all_reduce(t)
    assert torch.equal(ts[0], torch.full((3,), 6.0)) and torch.equal(ts[1], torch.full((1,), 6.0))
    ok("coalescing_manager")

    # sparse all_reduce: the sum, coalesced; entries differ per rank, some overlap
    idx = torch.tensor([[r, r + 1], [0, r]])
    sp = torch.sparse_coo_tensor(idx, torch.tensor([1.0, 10.0 * (r + 1)]), (n + 1, n))
    want = torch.zeros(n + 1, n)
    for k in range(n):
        want[k, 0] += 1.0
        want[k + 1, k] += 10.0 * (k + 1)
    tdist.all_reduce(sp)
    assert sp.is_coalesced() and torch.equal(sp.to_dense(), want), sp
    # a dense dimension, and a rank with no entries
    v = torch.ones(r, 2) if r else torch.zeros(0, 2)
    sp = torch.sparse_coo_tensor(torch.arange(r).reshape(1, r), v, (4, 2))
    tdist.all_reduce(sp)
    dense = torch.zeros(4, 2)
    for k in range(n):
        dense[:k] += 1
    assert torch.equal(sp.to_dense(), dense), sp
    raises(ValueError, lambda: tdist.all_reduce(sp, op=tdist.ReduceOp.MAX), "SUM")
    ok("sparse_all_reduce")

    # receives from any source (torch calls the group's recv_anysource): recv returns
    # the sender's global rank, an irecv's Work._source_rank() its rank in the group
    sub = tdist.new_group([0, 2], backend="minidist")
    if r == 0:
        senders = []
        for _ in range(n - 1):
            t = torch.zeros(3)
            sender = tdist.recv(t)
            assert torch.equal(t, torch.full((3,), float(sender))), (sender, t)
            senders.append(sender)
        assert sorted(senders) == [1, 2], senders
        t = torch.zeros(3)
        w = tdist.irecv(t, tag=7)
        w.wait()
        assert w._source_rank() == 1 and t[0].item() == 1.0, (w._source_rank(), t)
        w = tdist.irecv(t, group=sub)
        w.wait()
        assert w._source_rank() == 1 and t[0].item() == 20.0, (w._source_rank(), t)
        assert tdist.recv(t, group=sub) == 2 and t[0].item() == 21.0, t
    else:
        tdist.send(torch.full((3,), float(r)), dst=0)
        if r == 1:
            tdist.send(torch.ones(3), dst=0, tag=7)
        else:
            tdist.send(torch.full((3,), 20.0), dst=0, group=sub)
            tdist.send(torch.full((3,), 21.0), dst=0, group=sub)
    ok("any_source")

    # monitored_barrier through the process group, with gloo's wording; rank 2 is late
    world.monitored_barrier(seconds(30))
    mdt.monitored_barrier(world, timeout=seconds(30), wait_all_ranks=True)
    if r == 0:
        e = raises(minidist.DistTimeoutError,
                   lambda: world.monitored_barrier(seconds(1)),
                   "[Rank 0]: Rank 2 failed to pass monitoredBarrier in 1000 ms")
        assert "global rank(s) [2]" in str(e) and e.missing == (2,), e
    elif r == 1:
        t0 = time.monotonic()
        raises(minidist.DistTimeoutError, lambda: world.monitored_barrier(seconds(1)),
               "Rank 1 successfully reached monitoredBarrier, but received errors while "
               "waiting for send/recv from rank 0")
        assert time.monotonic() - t0 < 20
    tdist.barrier(group=sync)
    if r == 2:  # arrives late: rank 0 already reported it
        raises(minidist.DistTimeoutError, lambda: world.monitored_barrier(seconds(1)),
               "Rank 2 successfully reached monitoredBarrier")
    tdist.barrier(group=sync)
    # through minidist.torch, every missing rank; then rank 0 without waiting at all
    if r == 0:
        raises(minidist.DistTimeoutError,
               lambda: mdt.monitored_barrier(world, timeout=seconds(0.5),
                                             wait_all_ranks=True),
               "[Rank 0]: Ranks 1, 2 failed to pass monitoredBarrier in 500 ms")
        raises(minidist.DistTimeoutError,
               lambda: mdt.monitored_barrier(world, timeout=seconds(0)),
               "Rank 0 timed out in monitoredBarrier after 0 ms.")
    tdist.barrier(group=sync)
    # torch.distributed.monitored_barrier itself accepts gloo groups only
    raises(ValueError, lambda: tdist.monitored_barrier(world), "GLOO")
    ok("monitored_barrier")

    # a timeout reads as torch's backends word it (and is still minidist's error)
    late = tdist.new_group(backend="minidist", timeout=seconds(1))
    if r == 0:
        e = raises(minidist.DistTimeoutError, lambda: tdist.barrier(group=late),
                   "[minidist] Timed out waiting for barrier: ")
        assert " Timed out " in str(e) and e.missing, e
        w = tdist.all_reduce(torch.ones(1), group=sync, async_op=True)
        raises(minidist.DistTimeoutError, lambda: w.wait(seconds(0.2)),
               "Timed out waiting 200ms for all_reduce")
        w.wait()  # the call itself went on
    else:
        time.sleep(3.0)
        tdist.all_reduce(torch.ones(1), group=sync)
    ok("timeout_wording")

    tdist.barrier(group=sync)
    tdist.destroy_process_group()
    print(f"rank {r}: done", flush=True)


if __name__ == "__main__":
    main()
