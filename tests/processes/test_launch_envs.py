"""Jobs started by other launchers' environments (torchrun, Slurm, Open MPI), without them."""

from __future__ import annotations

import socket
import subprocess
import sys

import pytest

from .harness import SCRIPTS, clean_env

pytestmark = pytest.mark.timeout(90)


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def spawn(n: int, make_env) -> list[subprocess.Popen]:
    procs = []
    try:
        for r in range(n):
            procs.append(subprocess.Popen([sys.executable, str(SCRIPTS / "reinit.py")],
                                          env=clean_env(**make_env(r)), text=True,
                                          stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                                          start_new_session=True))
        outs = [p.communicate(timeout=60) for p in procs]
    finally:
        for p in procs:
            if p.poll() is None:
                p.kill()
                p.wait()
    return [(p.returncode, o, e) for p, (o, e) in zip(procs, outs)]


def test_torchrun_environment_with_master_port_taken():
    n = 3
    # torchrun's own store holds MASTER_PORT: minidist must not need it
    store = socket.socket()
    store.bind(("127.0.0.1", 0))
    store.listen()
    master_port = store.getsockname()[1]
    try:
        results = spawn(n, lambda r: {
            "RANK": str(r), "WORLD_SIZE": str(n), "LOCAL_RANK": str(r),
            "LOCAL_WORLD_SIZE": str(n), "MASTER_ADDR": "127.0.0.1",
            "MASTER_PORT": str(master_port), "TORCHELASTIC_RUN_ID": f"t{master_port}",
        })
    finally:
        store.close()
    for rc, out, err in results:
        assert rc == 0, err
        assert "REINIT OK" in out


@pytest.mark.parametrize("launcher", ["slurm", "mpirun"])
def test_slurm_and_open_mpi_environments(launcher):
    n = 3
    port = free_port()
    if launcher == "slurm":
        def env(r):
            return {"SLURM_PROCID": str(r), "SLURM_NTASKS": str(n), "SLURM_LOCALID": str(r),
                    "SLURM_NNODES": "1", "SLURM_JOB_ID": str(port), "MINIDIST_PORT": str(port)}
    else:
        def env(r):
            return {"OMPI_COMM_WORLD_RANK": str(r), "OMPI_COMM_WORLD_SIZE": str(n),
                    "OMPI_COMM_WORLD_LOCAL_RANK": str(r), "OMPI_COMM_WORLD_LOCAL_SIZE": str(n),
                    "OMPI_MCA_ess_base_jobid": str(port), "MINIDIST_PORT": str(port)}
    for rc, out, err in spawn(n, env):
        assert rc == 0, err
        assert "REINIT OK" in out
