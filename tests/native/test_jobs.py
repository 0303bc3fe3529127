"""The CPU-testable parts in real multi-process jobs (``minidist run``): the set-up's
exchange over minidist's rendezvous (NCCL's unique id included, made by the installed
libnccl when there is one), host staging (alone and meeting a CPU rank's minidist.torch
calls), the CUDA IPC algorithm over host shared memory, the public calls end to end,
and the peer watch."""

from __future__ import annotations

import re

import pytest

from .conftest import libnccl
from .jobs import lines, run

pytestmark = pytest.mark.timeout(180)


def ok(r):
    assert r.returncode == 0, r.stdout[-3000:] + r.stderr[-3000:]
    return r.stdout


# ---------------------------------------------------------------------- the exchange


@pytest.mark.parametrize("real", [False, True])
def test_the_unique_id_travels_over_the_rendezvous(real):
    if real and libnccl() is None:
        pytest.skip("no libnccl installed (pip install nvidia-nccl-cu12)")
    out = ok(run(4, "exchange.py", "uid", "real" if real else "fake"))
    assert lines(out, "CHOICE ") == ["nccl | NCCL 2.99.0: every rank on a GPU of its own"] * 4
    uids = lines(out, "UID ")
    assert len(uids) == 4 and len(set(uids)) == 1 and uids[0].startswith("128 ")
    assert lines(out, "LEFT ") == ["[]"]  # the set-up's keys were removed


def test_ranks_sharing_a_gpu_agree_on_ipc():
    out = ok(run(3, "exchange.py", "shared"))
    choices = lines(out, "CHOICE ")
    assert len(choices) == 3 and len(set(choices)) == 1
    assert choices[0].startswith("ipc | CUDA IPC (global ranks [0, 1] share GPU GPU-shared")


def test_a_host_only_rank_makes_the_group_stage():
    out = ok(run(3, "exchange.py", "mixed"))
    assert lines(out, "CHOICE ") == [
        "host | global ranks [2] pass CPU tensors: staged through host memory"] * 2
    assert lines(out, "LEFT ") == ["[]"]


def test_a_failed_set_up_stops_the_others_at_once():
    out = ok(run(3, "exchange.py", "fail"))
    failed = lines(out, "FAILED ")
    assert len(failed) == 3
    others = [f for f in failed if f.startswith("SetupFailed")]
    assert len(others) == 2
    for f in others:
        assert float(re.search(r"after=([\d.]+)", f).group(1)) < 5
        assert "could not make NCCL's unique id: no unique id today" in f


def test_a_rank_that_never_joins_is_named_at_the_deadline():
    out = ok(run(3, "exchange.py", "missing"))
    t = lines(out, "TIMEOUT ")
    assert len(t) == 2
    assert all(x.startswith("missing=[2]") and "declare_host" in x for x in t)


# ---------------------------------------------------------------------- data paths


def test_host_staging_every_collective_and_dtype():
    out = ok(run(3, "staged.py", "host"))
    counts = lines(out, "OK ")
    assert len(counts) == 3 and len(set(counts)) == 1 and int(counts[0]) > 500


def test_staged_calls_meet_a_cpu_rank_using_minidist_torch():
    out = ok(run(3, "staged.py", "mixed"))
    assert len(lines(out, "OK ")) == 3


@pytest.mark.parametrize("n,capacity,cap", [(3, 4096, 0), (4, 1 << 20, 0),
                                            (3, 4096, 1 << 20), (3, 4096, 16384)])
def test_the_ipc_algorithm_over_host_shared_memory(n, capacity, cap):
    args = [str(capacity)] + ([str(cap)] if cap else [])
    out = ok(run(n, "staged.py", "ipc", *args))
    assert len(lines(out, "OK ")) == n
    chunks = lines(out, "CHUNKS ")
    assert len(set(chunks)) == 1  # every rank moved the same chunks
    m = re.match(r"(\d+) TWO_PHASE (\d+) GROWN (\d+) CAPACITY (\d+)", chunks[0])
    if cap:  # grew together, by powers of two, up to the cap and no further
        grown, size = int(m.group(3)), int(m.group(4))
        assert grown >= 1 and size <= cap and size % capacity == 0
        assert (size // capacity) & (size // capacity - 1) == 0
        if cap == 16384:
            assert size == cap  # the test's larger calls need more than that
        else:
            assert int(m.group(1)) < 1000  # large calls in one chunk
    elif capacity == 4096:
        assert int(m.group(1)) > 1000  # small slots: many chunks, slots alternating
        assert int(m.group(3)) == 0
    else:
        assert int(m.group(2)) > 0  # large chunks of 4 ranks: reduce-scatter + gather


@pytest.mark.parametrize("mode", ["host", "ipc"])
def test_the_public_calls_end_to_end(mode):
    out = ok(run(3, "api.py", mode))
    assert len(lines(out, "OK")) == 3
    comms = lines(out, "COMM ")
    paths = {c.split()[0] for c in comms}
    if mode == "host":
        assert paths == {"host"}
    else:  # the world and {0, 1} share a GPU: IPC; the pair's messages: host staging
        assert any(c.startswith("ipc group 0x0 ") for c in comms)
        assert any(c.startswith("host pair 0<->1") for c in comms)
    assert all("is not a member" in b for b in lines(out, "BADROOT "))


def test_a_dead_rank_fails_the_next_call_and_breaks_the_group():
    r = run(3, "api.py", "ipc", "die")
    lost = lines(r.stdout, "LOST ")
    assert len(lost) == 2 and all(x.startswith("[2]") for x in lost), r.stdout + r.stderr
    again = lines(r.stdout, "AGAIN ")
    assert len(again) == 2
    assert all(a.startswith("PeerLostError") and "unusable since a call on it failed" in a
               for a in again)


# ---------------------------------------------------------------------- liveness


def test_the_peer_watch_hears_a_death_within_seconds():
    r = run(3, "liveness.py", "dies")
    fired = lines(r.stdout, "FIRED ")
    assert len(fired) == 2, r.stdout + r.stderr
    for f in fired:
        assert f.startswith("True peer=1 type=PeerLostError ranks=[1] left=False")
        assert float(re.search(r"after=([\d.]+)", f).group(1)) < 10
    assert lines(r.stdout, "KNOWN ") == ["PeerLostError"] * 2


def test_watches_do_not_hold_up_leaving():
    out = ok(run(3, "liveness.py", "leaves", timeout=60))
    left = lines(out, "LEFT ")
    assert len(left) == 3
    assert all(float(x.split("=")[1]) < 10 for x in left)
