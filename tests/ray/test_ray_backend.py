"""minidist as a Ray collective backend, on a local Ray cluster of 2 CPUs: every
collective on numpy arrays and CPU torch tensors, groups declared by the actors or by
the driver, several groups per actor, re-created groups, and dead actors."""

from __future__ import annotations

import contextlib
import glob
import os
import subprocess
import sys
import time
from pathlib import Path

import pytest

ray = pytest.importorskip("ray")
pytest.importorskip("ray.util.collective.backend_registry")
pytest.importorskip("torch")

import ray.util.collective as col  # noqa: E402
from ray.experimental import internal_kv  # noqa: E402

import minidist  # noqa: E402
import minidist.ray  # noqa: E402,F401  (registers the backend on the driver)
from minidist import segments  # noqa: E402

from .actors import Member  # noqa: E402

ROOT = Path(__file__).resolve().parents[2]
WAIT = 60  # seconds any ray.get may take


@pytest.fixture(scope="module")
def cluster():
    """A local Ray cluster for this module, shut down even when a test fails; then the
    names its processes left in /dev/shm are removed (Ray ends its actors, the example's
    included, with SIGKILL, and no launcher sweeps after them)."""
    before = set(_names())
    ray.init(num_cpus=2, address="local", include_dashboard=False,
             job_config=ray.job_config.JobConfig(code_search_path=[str(ROOT)]))
    try:
        yield
    finally:
        ray.shutdown()
        left = {path: int(path.rsplit("-", 1)[1]) for path in set(_names()) - before}
        _sweep_after(sorted(set(left.values())))


def _names() -> list[str]:
    """minidist's names in /dev/shm (each ends with its creator's pid)."""
    return [p for p in glob.glob(os.path.join(segments.SHM_DIR, "minidist-*-*"))
            if p.rsplit("-", 1)[1].isdigit()]


def _start(n: int) -> list:
    actors = [Member.remote(30.0) for _ in range(n)]
    ray.get([a.pid.remote() for a in actors], timeout=WAIT)
    return actors


def _kill(actors) -> None:
    for a in actors:
        ray.kill(a, no_restart=True)


@pytest.fixture(scope="module")
def pool(cluster):
    """Four actors shared by the tests (starting an actor costs seconds on 2 cores);
    empty after a test that left them in doubt or killed them."""
    box = [_start(4)]
    try:
        yield box
    finally:
        _kill(box[0])


@pytest.fixture
def members(pool):
    """Four actors with no group; after the test every group they still hold is
    destroyed, or, if that fails, they are killed (and replaced for the next test)."""
    if not pool[0]:
        pool[0] = _start(4)
    actors = pool[0]
    try:
        yield actors
    finally:
        try:
            ray.get([a.reset.remote() for a in actors], timeout=10)
        except Exception:
            _kill(actors)
            pool[0] = []  # the next test starts new ones
            raise


@pytest.fixture
def doomed(pool):
    """The pool's four actors, for a test that kills some: the pool is restarted for
    any later test that needs it (none does in this file's order), else just killed.
    What the killed actors had in /dev/shm is removed once they are gone (no launcher
    sweeps after Ray's processes)."""
    actors = pool[0] or _start(4)
    pool[0] = []
    pids = ray.get([a.pid.remote() for a in actors], timeout=WAIT)
    try:
        yield actors
    finally:
        _kill(actors)
        _sweep_after(pids)


def _sweep_after(pids: list[int]) -> None:
    """Once processes ``pids`` are gone (10 s at most), remove the shared-memory names
    they made (minidist names end with their creator's pid)."""
    end = time.monotonic() + 10
    while any(segments.alive(p) for p in pids) and time.monotonic() < end:
        time.sleep(0.05)
    for pid in pids:
        if not segments.alive(pid):
            for path in glob.glob(os.path.join(segments.SHM_DIR, f"minidist-*-{pid}")):
                with contextlib.suppress(FileNotFoundError):
                    os.unlink(path)


def join(actors, name, ranks=None):
    ranks = list(range(len(actors))) if ranks is None else ranks
    got = ray.get([a.join.remote(len(actors), r, name) for a, r in zip(actors, ranks)],
                  timeout=WAIT)
    assert got == ranks


def leave(actors, name):
    ray.get([a.leave.remote(name) for a in actors], timeout=WAIT)


@pytest.mark.timeout(120)
def test_every_collective_on_numpy_and_torch(members):
    join(members, "all")
    n = len(members)
    res = ray.get([a.numpy_suite.remote("all") for a in members], timeout=WAIT)
    for r, got in enumerate(res):
        assert got["allreduce"] == sum(range(1, n + 1))
        assert got["allreduce_big"] == [sum(range(1, n + 1))] * 2
        assert got["allreduce_max"] == n
        assert got["allreduce_prod"] == 2 * 3 * 4 * 5
        assert got["broadcast"] == [i * n for i in range(10)]  # from the last rank
        assert got["allgather"] == list(range(n)) + [(2, 3)]
        assert got["reducescatter"] == sum(10 * q + r for q in range(n))
        assert got["reducescatter_inputs_kept"] == [10 * r + i for i in range(n)]
        assert got["reduce"] == (sum(range(1, n + 1)) if r == 1 else r + 1)  # dst 1
        assert got["recv"] == (r - 1) % n
    res = ray.get([a.torch_suite.remote("all") for a in members], timeout=WAIT)
    for r, got in enumerate(res):
        assert got["allreduce"] == sum(range(1, n + 1))
        assert got["broadcast_strided"] == [1.0] * 4
        assert got["broadcast_bf16"] == 2.0
        assert got["allgather"] == [float(q) for q in range(n)]
        assert got["reducescatter_min"] == float(r)
        assert got["reduce"] == (sum(range(1, n + 1)) if r == 0 else r + 1)
        assert got["recv"] == (7.0 if r == n - 1 else 0.0)
    for d in ray.get([a.describe.remote() for a in members], timeout=WAIT):
        assert len(d) == 1 and d[0]["groups"] == ["all"] and d[0]["size"] == n
    leave(members, "all")
    assert ray.get([a.describe.remote() for a in members], timeout=WAIT) == [[]] * n


@pytest.mark.timeout(120)
def test_group_declared_by_the_driver(members):
    """create_collective_group on the driver; the actors create it on first use."""
    ranks = [3, 2, 1, 0]
    col.create_collective_group(members, 4, ranks, backend="minidist",
                                group_name="declared")
    try:
        got = ray.get([a.allreduce.remote("declared", float(i)) for i, a in
                       enumerate(members)], timeout=WAIT)
        assert got == [6.0] * 4
        # rank 0 of the group is the last actor
        got = ray.get([a.broadcast.remote("declared", float(i), 0) for i, a in
                       enumerate(members)], timeout=WAIT)
        assert got == [3.0] * 4
    finally:
        leave(members, "declared")  # also removes the driver's detached info actor


@pytest.mark.timeout(120)
def test_later_groups_of_the_same_actors_share_their_job(members):
    join(members, "all")
    # the workers' group, in an order of its own: a group of the same job, no socket
    workers = members[1:][::-1]
    join(workers, "workers")
    got = ray.get([a.broadcast.remote("workers", float(i), 0) for i, a in
                   enumerate(workers)], timeout=WAIT)
    assert got == [0.0] * 3  # rank 0 of "workers" is the last actor (i = 0 here)
    got = ray.get([a.allreduce.remote("workers", 1.0) for a in workers], timeout=WAIT)
    assert got == [3.0] * 3
    descs = ray.get([a.describe.remote() for a in members], timeout=WAIT)
    assert len({d[0]["job"] for d in descs}) == 1
    assert [len(d) for d in descs] == [1] * 4
    assert descs[0][0]["groups"] == ["all"]
    assert all(d[0]["groups"] == ["all", "workers"] for d in descs[1:])
    # the world goes on while the workers' group lives, and after it is gone
    got = ray.get([a.allreduce.remote("all", 2.0) for a in members], timeout=WAIT)
    assert got == [8.0] * 4
    leave(workers, "workers")
    got = ray.get([a.allreduce.remote("all", 1.0) for a in members], timeout=WAIT)
    assert got == [4.0] * 4
    leave(members, "all")


@pytest.mark.timeout(120)
def test_the_host_keeps_the_job_for_the_others(members):
    """The actor hosting the job (rank 0 of "all") destroys its only group while the
    workers go on with theirs: the job outlives the host's timeout for them, and ends
    once they have left too."""
    ray.get(members[0].set_timeout.remote(3.0), timeout=WAIT)  # the host's job timeout
    try:
        join(members, "all")
        workers = members[1:]
        join(workers, "workers")
        leave(members[:1], "all")
        assert ray.get(members[0].describe.remote(), timeout=WAIT) == []
        time.sleep(3.5)  # longer than the host's timeout
        got = ray.get([a.allreduce.remote("workers", 1.0) for a in workers], timeout=WAIT)
        assert got == [3.0] * 3
        leave(workers, "workers")
        leave(workers, "all")
    finally:
        ray.get(members[0].set_timeout.remote(30.0), timeout=WAIT)


@pytest.mark.timeout(120)
def test_groups_with_other_members_start_jobs_of_their_own(members):
    a0, a1, a2, a3 = members
    join([a0, a1], "a")                 # job A
    join([a1, a2, a3], "b")             # a2, a3 are not in A: job B
    join(members, "c")                  # no job holds all four: job C
    join([a3, a2], "d")                 # both in B (and C): a group of B
    descs = ray.get([a.describe.remote() for a in members], timeout=WAIT)
    groups = [{g: d["job"] for d in desc for g in d["groups"]} for desc in descs]
    assert groups[1]["a"] == groups[0]["a"]
    assert groups[1]["b"] == groups[2]["b"] == groups[3]["b"] != groups[1]["a"]
    assert len({g["c"] for g in groups}) == 1
    assert groups[2]["d"] == groups[3]["d"] == groups[2]["b"]
    assert [len(d) for d in descs] == [2, 3, 2, 2]
    for _ in range(2):  # every actor runs its groups' calls in the same order
        assert ray.get([a.allreduce.remote("a", 1.0) for a in (a0, a1)],
                       timeout=WAIT) == [2.0] * 2
        assert ray.get([a.allreduce.remote("b", 1.0) for a in (a1, a2, a3)],
                       timeout=WAIT) == [3.0] * 3
        assert ray.get([a.allreduce.remote("c", 1.0) for a in members],
                       timeout=WAIT) == [4.0] * 4
        assert ray.get([a.broadcast.remote("d", float(i), 1) for i, a in
                        enumerate((a3, a2))], timeout=WAIT) == [1.0] * 2
    # B lives on in a2 and a3 (group d) after b is gone; a1 leaves it
    leave([a1, a2, a3], "b")
    assert ray.get([a.allreduce.remote("d", 2.0) for a in (a3, a2)],
                   timeout=WAIT) == [4.0] * 2
    assert len(ray.get(a1.describe.remote(), timeout=WAIT)) == 2
    leave([a0, a1], "a")
    leave(members, "c")
    leave([a3, a2], "d")
    assert ray.get([a.describe.remote() for a in members], timeout=WAIT) == [[]] * 4


@pytest.mark.timeout(120)
def test_recreated_groups_and_stale_keys(members):
    join(members, "g")
    assert ray.get([a.allreduce.remote("g", 1.0) for a in members], timeout=WAIT) == [4.0] * 4
    leave(members, "g")
    join(members, "g")  # the same name again: a new job
    assert ray.get([a.allreduce.remote("g", 2.0) for a in members], timeout=WAIT) == [8.0] * 4
    leave(members, "g")
    # keys left by a group "s" that died while starting: ignored
    prefix = f"{ray.get_runtime_context().get_job_id()}/s/"
    for key, value in [("open", "stale"), ("m/1", '{"open": "stale"}'),
                       ("plan", '{"open": "stale", "nonces": ["x", "y", "z", "w"]}')]:
        internal_kv._internal_kv_put(prefix + key, value, namespace="minidist")
    later = [a.join.remote(4, r, "s") for r, a in enumerate(members) if r]
    time.sleep(0.5)  # the others have read the stale keys before rank 0 comes
    first = members[0].join.remote(4, 0, "s")
    assert ray.get([first, *later], timeout=WAIT) == [0, 1, 2, 3]
    assert ray.get([a.allreduce.remote("s", 1.0) for a in members], timeout=WAIT) == [4.0] * 4
    leave(members, "s")
    assert internal_kv._internal_kv_list(prefix, namespace="minidist") == []
    # a group of one
    assert ray.get(members[0].join.remote(1, 0, "solo"), timeout=WAIT) == 0
    assert ray.get(members[0].allreduce.remote("solo", 5.0), timeout=WAIT) == 5.0
    leave(members[:1], "solo")


@pytest.mark.timeout(120)
def test_bad_group_creation_raises(members):
    """A rank that never comes: the others time out; ranks that disagree: all raise."""
    ray.get([a.set_timeout.remote(2.0) for a in members], timeout=WAIT)
    try:
        for missing in (3, 0):  # a worker, then rank 0 (who would host the job)
            calls = [a.join.remote(4, r, f"short{missing}") for r, a in enumerate(members)
                     if r != missing]
            t = time.monotonic()
            for c in calls:
                with pytest.raises(minidist.DistTimeoutError, match="init_collective_group"):
                    ray.get(c, timeout=WAIT)
            assert time.monotonic() - t < 10
        # ranks that disagree on the world size are all told so, at once
        calls = [a.join.remote(5 if r == 3 else 4, r, "mismatch")
                 for r, a in enumerate(members)]
        for c in calls:
            with pytest.raises(ValueError, match="different world sizes"):
                ray.get(c, timeout=WAIT)
        assert ray.get([a.describe.remote() for a in members], timeout=WAIT) == [[]] * 4
    finally:
        ray.get([a.set_timeout.remote(30.0) for a in members], timeout=WAIT)


@pytest.mark.timeout(120)
def test_a_killed_actor_makes_the_others_raise(doomed):
    members = doomed
    join(members, "all")
    # rank 3 never joins the allreduce; it is killed while the others wait for it
    calls = [a.allreduce_raises.remote("all") for a in members[:3]]
    time.sleep(1.0)
    ray.kill(members[3], no_restart=True)
    killed = time.monotonic()
    res = ray.get(calls, timeout=WAIT)
    after = time.monotonic() - killed
    for kind, msg, _ in res:
        assert kind == "PeerLostError", (kind, msg)
        assert "3" in msg
    assert after < 10, after
    # the group stays broken: a later call raises at once, through ray.get too
    with pytest.raises(minidist.PeerLostError, match="Ray collective group 'all'"):
        ray.get(members[0].allreduce.remote("all", 1.0), timeout=WAIT)
    # the others leave the broken group and start again without the dead actor
    survivors = members[:3]
    leave(survivors, "all")
    join(survivors, "again")
    assert ray.get([a.allreduce.remote("again", 1.0) for a in survivors],
                   timeout=WAIT) == [3.0] * 3
    # the actor that hosts the job (rank 0) dies: the others raise too
    calls = [a.allreduce_raises.remote("again") for a in survivors[1:]]
    time.sleep(1.0)
    ray.kill(survivors[0], no_restart=True)
    killed = time.monotonic()
    res = ray.get(calls, timeout=WAIT)
    for kind, msg, _ in res:
        assert kind == "PeerLostError", (kind, msg)
    assert time.monotonic() - killed < 10


@pytest.mark.timeout(120)
def test_the_example_runs(cluster):
    """examples/ray_learner_workers.py, as a second driver of this module's cluster."""
    address = ray.get_runtime_context().gcs_address
    out = subprocess.run(
        [sys.executable, str(ROOT / "examples" / "ray_learner_workers.py"), "--workers", "2",
         "--rounds", "3", "--address", address],
        capture_output=True, text=True, timeout=90, cwd=ROOT)
    assert out.returncode == 0, out.stdout + out.stderr
    assert "round 2: weights norm" in out.stdout
    assert "belongs to 1 minidist job(s)" in out.stdout, out.stdout
