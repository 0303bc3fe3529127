"""minidist.job_secret: who hands out the secret, where, and what it refuses."""

from __future__ import annotations

import dataclasses
import os
import subprocess
import sys
import time

import pytest

from minidist import env, job_secret


def _torchrun(rank: int, n: int, local: int | None = None, **extra: str) -> dict[str, str]:
    return {"RANK": str(rank), "WORLD_SIZE": str(n), "LOCAL_RANK": str(rank),
            "LOCAL_WORLD_SIZE": str(n if local is None else local),
            "MASTER_ADDR": "127.0.0.1", "MASTER_PORT": "29400",
            "TORCHELASTIC_RUN_ID": "none", **extra}


def test_only_a_one_node_job_without_a_given_secret_shares_one():
    one = env.detect(_torchrun(1, 4))
    assert one.share_secret and not one.public_secret
    many = env.detect(_torchrun(1, 8, local=4))
    assert many.public_secret and not many.share_secret
    given = env.detect(_torchrun(1, 4, MINIDIST_SECRET="s"))
    assert not given.share_secret and not given.public_secret
    run = env.detect({**_torchrun(1, 4), "MINIDIST_LAUNCHER": "1", "MINIDIST_SECRET": "x"})
    assert not run.share_secret
    mpi = env.detect({"OMPI_COMM_WORLD_RANK": "0", "OMPI_COMM_WORLD_SIZE": "2",
                      "OMPI_COMM_WORLD_LOCAL_SIZE": "2"})
    assert mpi.share_secret
    alone = env.detect({})
    assert not alone.share_secret and not alone.public_secret


def test_rank_0_writes_a_private_file_the_others_read_and_it_is_removed(tmp_path):
    xdg = tmp_path / "run"
    xdg.mkdir(mode=0o700)
    os.environ["XDG_RUNTIME_DIR"] = str(xdg)
    try:
        cfg0 = env.detect(_torchrun(0, 2))
        cfg1 = env.detect(_torchrun(1, 2))
        gen = job_secret._inits + 1
        path = job_secret.file_for(cfg0, gen)
        assert path.startswith(str(xdg / "minidist") + "/")
        mine = job_secret.resolve(cfg0, 5)
        st = os.stat(path)
        assert st.st_mode & 0o777 == 0o600
        assert os.stat(os.path.dirname(path)).st_mode & 0o777 == 0o700
        assert mine.secret != cfg0.secret and len(mine.secret) == 64
        job_secret._inits -= 1  # the same process plays rank 1 of that init
        theirs = job_secret.resolve(cfg1, 5)
        assert theirs.secret == mine.secret and not theirs.share_secret
        job_secret.joined(mine)
        assert not os.path.exists(path)
    finally:
        del os.environ["XDG_RUNTIME_DIR"]


def test_a_directory_others_may_enter_or_own_is_refused(tmp_path):
    d = tmp_path / "open"
    d.mkdir()
    d.chmod(0o755)
    with pytest.raises(job_secret.SecretFileError, match="mode 755"):
        job_secret._private_dir(str(d), os.geteuid(), create=True)
    assert not job_secret._private_dir(str(d), os.geteuid(), create=False)
    d.chmod(0o700)
    assert job_secret._private_dir(str(d), os.geteuid(), create=True)
    with pytest.raises(job_secret.SecretFileError, match="belongs to uid"):
        job_secret._private_dir(str(d), os.geteuid() + 1, create=True)
    link = tmp_path / "link"
    link.symlink_to(d)
    with pytest.raises(job_secret.SecretFileError, match="not a directory"):
        job_secret._private_dir(str(link), os.geteuid(), create=True)


def test_a_file_left_by_a_dead_rank_0_or_open_to_others_is_not_taken(tmp_path):
    dead = subprocess.Popen([sys.executable, "-c", "pass"])
    dead.wait()
    path = tmp_path / "job"
    fd = os.open(path, os.O_WRONLY | os.O_CREAT, 0o600)
    os.write(fd, f'{{"secret": "old", "pid": {dead.pid}}}'.encode())
    os.close(fd)
    secret, why = job_secret._read(str(path), "")
    assert secret is None and "has exited" in why
    path.chmod(0o644)
    with pytest.raises(job_secret.SecretFileError, match="mode 644"):
        job_secret._read(str(path), "")


def test_a_rank_waits_for_rank_0_up_to_its_deadline_and_says_what_for(tmp_path):
    os.environ["XDG_RUNTIME_DIR"] = str(tmp_path)
    tmp_path.chmod(0o700)
    try:
        cfg = dataclasses.replace(env.detect(_torchrun(1, 2)), master_addr="127.0.0.1")
        t0 = time.monotonic()
        with pytest.raises(env_timeout(), match="rank 0 hands out"):
            job_secret.resolve(cfg, 0.3)
        assert 0.3 <= time.monotonic() - t0 < 3
    finally:
        del os.environ["XDG_RUNTIME_DIR"]


def env_timeout() -> type[Exception]:
    from minidist.errors import DistTimeoutError

    return DistTimeoutError


def test_minidist_run_reads_a_private_secret_file_and_warns_only_without_one(tmp_path):
    from minidist.launcher import Launcher, RunOptions

    f = tmp_path / "secret"
    f.write_text("s3cret\nignored\n")
    f.chmod(0o600)
    with_file = Launcher(RunOptions(nproc=1, target="x.py", nnodes=2, master_port=1234,
                                    secret_file=str(f)))
    assert with_file.secret == "s3cret" and with_file.secret_warning() is None
    bare = Launcher(RunOptions(nproc=1, target="x.py", nnodes=2, master_port=1234))
    assert "derived from --master-addr" in bare.secret_warning()
    other_node = Launcher(RunOptions(nproc=1, target="x.py", nnodes=2, node_rank=1,
                                     master_port=1234))
    assert other_node.secret_warning() is None  # once per job: the first node says it
    assert Launcher(RunOptions(nproc=1, target="x.py")).secret_warning() is None
    f.chmod(0o640)
    with pytest.raises(ValueError, match="chmod 600"):
        Launcher(RunOptions(nproc=1, target="x.py", nnodes=2, secret_file=str(f)))
    f.write_text("\n")
    f.chmod(0o600)
    with pytest.raises(ValueError, match="empty"):
        Launcher(RunOptions(nproc=1, target="x.py", nnodes=2, secret_file=str(f)))
