"""Engines of several ranks in one event loop, joined in memory (no socket, no
rendezvous but the forwarding of aborts): their schedules give the simulator's bits,
mismatched calls fail on every rank without a byte landing, and a peer that goes away
fails the call waiting on it."""

from __future__ import annotations

import asyncio

import numpy as np
import pytest

from minidist import ops
from minidist.algorithms.simulator import simulate
from minidist.engine import Engine
from minidist.errors import CollectiveMismatchError, PeerLostError
from minidist.ops import ReduceOp
from minidist.plan import Planner
from minidist.transport.mailbox import Mailbox
from minidist.transport.memory import MemoryNetwork
from minidist.transport.reader import STAGE

ALGORITHMS = ["ring", "recursive_doubling", "tree", "rabenseifner", "double_binary_tree"]


class Rank:
    """One rank: its engine on the network, and a planner numbering its calls."""

    def __init__(self, net: MemoryNetwork, rank: int, size: int) -> None:
        self.engine = Engine(rank, Mailbox())
        self.end = net.join(rank, self.engine.mailbox, self.engine.connection_lost)
        self.engine.attach(self.end, net.control(rank, self.engine.abort_received))
        self.plan = Planner(rank, size, self.engine.next_seq, self.engine.next_p2p_seq,
                            False, None, {})

    async def all_reduce(self, x: np.ndarray, op: ReduceOp, algorithm: str,
                         timeout: float = 10.0) -> np.ndarray:
        """``x`` reduced across the ranks (a new array), as the socket path runs it."""
        p = self.plan.prepare_all_reduce(x, op, None, algorithm)
        p.bufs["tmp"] = np.empty(p.schedule.tmp_size, x.dtype)
        await self.engine.run(p.call, p.schedule, p.bufs, p.op, timeout, p.sent)
        out = p.bufs["out"]
        if p.finish:
            ops.finish(p.op, out, p.call.group.size)
        return out.reshape(x.shape).copy()


def job(n: int, chunk: int = 0) -> list[Rank]:
    net = MemoryNetwork(chunk)
    return [Rank(net, r, n) for r in range(n)]


def inputs(n: int, count: int, dtype=np.float32) -> list[np.ndarray]:
    rng = np.random.default_rng(n * 1000 + count)
    return [rng.standard_normal(count).astype(dtype) for _ in range(n)]


@pytest.mark.parametrize("algorithm", ALGORITHMS)
@pytest.mark.parametrize("n", [2, 3, 5])
async def test_all_reduce_gives_the_simulators_bits(n, algorithm):
    xs = inputs(n, 1000)
    want = simulate("all_reduce", algorithm, xs, ReduceOp.SUM)
    ranks = job(n)
    got = await asyncio.wait_for(asyncio.gather(
        *(r.all_reduce(x.copy(), ReduceOp.SUM, algorithm) for r, x in zip(ranks, xs))), 30)
    for r in range(n):  # the same schedule, the same order of additions: the same bits
        assert got[r].tobytes() == want[r].tobytes(), f"rank {r} differs"
    assert len({g.tobytes() for g in got}) == 1


@pytest.mark.parametrize("chunk", [1, 61, STAGE + 3])
async def test_streams_cut_anywhere_still_frame_every_call(chunk):
    # payloads both smaller and larger than the reader's staging buffer, three calls in a
    # row (each numbered), bytes arriving in pieces of any size
    n = 3
    ranks = job(n, chunk)
    for count in (5, 3 * STAGE // 4 + 1, 10):
        xs = inputs(n, count, np.float64)
        want = simulate("all_reduce", "ring", xs, ReduceOp.MAX)
        got = await asyncio.wait_for(asyncio.gather(
            *(r.all_reduce(x, ReduceOp.MAX, "ring") for r, x in zip(ranks, xs))), 30)
        assert all(g.tobytes() == w.tobytes() for g, w in zip(got, want))


@pytest.mark.parametrize("second", [dict(dtype=np.float64), dict(op=ReduceOp.MAX)],
                         ids=["dtype", "op"])
async def test_a_mismatched_call_fails_on_every_rank_and_changes_nothing(second):
    a, b = job(2)
    xa = np.arange(8, dtype=np.float32)
    xb = np.arange(8, dtype=second.get("dtype", np.float32)) * 10
    before = xa.copy(), xb.copy()
    got = await asyncio.wait_for(asyncio.gather(
        a.all_reduce(xa, ReduceOp.SUM, "ring"),
        b.all_reduce(xb, second.get("op", ReduceOp.SUM), "ring"),
        return_exceptions=True), 30)
    for r, err in enumerate(got):
        assert isinstance(err, CollectiveMismatchError), f"rank {r}: {err!r}"
        assert "collective mismatch" in str(err) and f"rank {1 - r} called" in str(err)
    # the headers are checked before any byte lands
    assert xa.tobytes() == before[0].tobytes() and xb.tobytes() == before[1].tobytes()
    # the group is unusable afterwards, on both ranks
    for rank, x in ((a, xa), (b, xb)):
        with pytest.raises(CollectiveMismatchError, match="unusable"):
            await rank.all_reduce(x, ReduceOp.SUM, "ring")


async def test_a_peer_that_goes_away_fails_the_call_waiting_on_it():
    a, b = job(2)
    waiting = asyncio.ensure_future(a.all_reduce(np.ones(4, np.float32), ReduceOp.SUM,
                                                 "ring"))
    await asyncio.sleep(0.05)
    assert not waiting.done()  # rank 1 has not called
    b.end.close()
    with pytest.raises(PeerLostError, match="rank 1 closed its connection"):
        await asyncio.wait_for(waiting, 30)
