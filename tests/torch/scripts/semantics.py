"""What the differential test cannot compare with gloo (gloo lacks it, or it is about
errors), on 3 ranks under ``minidist run``. Prints ``OK <check>`` per check on rank 0."""

from __future__ import annotations

import datetime
import time

import torch
import torch.distributed as tdist

import minidist
import minidist.torch as dist

RANK = [-1]


def ok(name: str) -> None:
    if RANK[0] == 0:
        print(f"OK {name}", flush=True)


def main() -> None:
    dist.init_process_group("gloo")
    r, n = dist.get_rank(), dist.get_world_size()
    RANK[0] = r
    assert n == 3

    # all_to_all with a different size per peer, and all_to_all_single with empty splits
    ins = [torch.full(((r + j) % 3 + 1,), float(10 * r + j)) for j in range(n)]
    outs = [torch.empty((i + r) % 3 + 1) for i in range(n)]
    dist.all_to_all(outs, ins)
    assert all(torch.equal(outs[i], torch.full(((i + r) % 3 + 1,), float(10 * i + r)))
               for i in range(n)), outs
    in_splits = [0 if j == (r + 1) % n else 2 for j in range(n)]
    out_splits = [0 if r == (i + 1) % n else 2 for i in range(n)]
    x = torch.arange(sum(in_splits) * 2, dtype=torch.int64).reshape(-1, 2) + 100 * r
    o = torch.full((sum(out_splits), 2), -1, dtype=torch.int64)
    dist.all_to_all_single(o, x, out_splits, in_splits)
    assert (o >= 0).all(), o
    ok("uneven_all_to_all")

    # groups: created by their members only, group ranks in the order given
    if r != 0:
        g = dist.new_group([2, 1], sort_ranks=False)
        assert dist.get_rank(g) == (0 if r == 2 else 1)
        t = torch.tensor([r])
        dist.broadcast(t, group=g, group_src=0)
        assert t.item() == 2
        got = torch.zeros(1)
        if r == 2:
            dist.send(torch.ones(1) * 5, group=g, group_dst=1)
        else:
            assert dist.recv(got, group=g, group_src=0) == 2 and got.item() == 5
    ok("groups_of_members_only")

    # receives from any source: recv returns the sender's global rank; an irecv's Work
    # has it as source_rank(), and as _source_rank() (torch's) counted in the group
    if r == 0:
        senders = []
        for _ in range(n - 1):
            t = torch.zeros(2)
            sender = dist.recv(t)
            assert (t == sender).all(), (sender, t)
            senders.append(sender)
        assert sorted(senders) == [1, 2], senders
        objs = [None]
        sender = dist.recv_object_list(objs)
        assert sender == 2 and objs == [{"from": 2}], (sender, objs)
    else:
        dist.send(torch.full((2,), float(r)), dst=0)
        if r == 2:
            dist.send_object_list([{"from": 2}], dst=0)
        # g is [2, 1]: global rank 2 is group rank 0
        if r == 1:
            got = torch.zeros(1)
            w = dist.irecv(got, group=g)
            w.wait()
            assert (w.source_rank(), w._source_rank(), got.item()) == (2, 0, 6.0)
        else:
            dist.send(torch.full((1,), 6.0), dst=1, group=g)
    ok("any_source")

    # several calls in flight, waited for out of order
    ts = [torch.full((1000,), float(r + k)) for k in range(5)]
    works = [dist.all_reduce(t, async_op=True) for t in ts]
    for k in reversed(range(5)):
        works[k].wait()
        assert ts[k][0].item() == sum(q + k for q in range(n))
    ok("async_out_of_order")

    # a torch Future callback that itself runs blocking collectives: never deadlocks
    def chained(fut):
        t = torch.ones(2)
        dist.all_reduce(t)  # the drop-in module
        tdist.all_reduce(t)  # torch.distributed on the mirrored default group
        return t.sum().item() + fut.value()[0].sum().item()

    w = dist.all_reduce(torch.ones(3), async_op=True)
    assert w.get_future().then(chained).wait() == 2 * n * n + 3 * n
    w = tdist.all_reduce(torch.ones(3), async_op=True)
    assert w.get_future().then(chained).wait() == 2 * n * n + 3 * n
    ok("future_callbacks")

    # mismatches are caught from the headers and leave the buffer alone
    if r == 0:
        dist.send(torch.ones(4, dtype=torch.bfloat16), dst=1)
    elif r == 1:
        buf = torch.full((4,), 7.0, dtype=torch.float16)
        try:
            dist.recv(buf, src=0)
            raise AssertionError("no mismatch error")
        except minidist.CollectiveMismatchError as e:
            assert "does not fit" in str(e), e
        assert (buf == 7).all()
    dist.barrier()
    ok("mismatch_detected")

    # monitored_barrier: passes, then names the rank that is late
    dist.monitored_barrier(timeout=datetime.timedelta(seconds=30))
    if r == 2:
        time.sleep(3.0)
    try:
        dist.monitored_barrier(timeout=datetime.timedelta(seconds=1.0), wait_all_ranks=True)
        late = None
    except minidist.DistTimeoutError as e:
        late = e
    if r == 0:
        assert late is not None and "[2]" in str(late) and late.missing == (2,), late
    dist.barrier()
    ok("monitored_barrier")

    dist.destroy_process_group()
    assert not minidist.is_initialized() and not tdist.is_initialized()
    ok("destroyed")


if __name__ == "__main__":
    main()
