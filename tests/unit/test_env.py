"""Launcher environments -> LaunchConfig."""

import pytest

from minidist.env import DEFAULT_PORT, detect, slurm_first_host


def test_no_launcher_is_a_world_of_one():
    cfg = detect({})
    assert (cfg.rank, cfg.world_size, cfg.local_rank, cfg.launcher) == (0, 1, 0, "none")


def test_torchrun_uses_master_port_plus_one():
    env = {"RANK": "3", "WORLD_SIZE": "8", "LOCAL_RANK": "1", "LOCAL_WORLD_SIZE": "4",
           "MASTER_ADDR": "10.1.2.3", "MASTER_PORT": "29500", "TORCHELASTIC_RUN_ID": "abc"}
    cfg = detect(env)
    assert (cfg.rank, cfg.world_size, cfg.local_rank, cfg.local_world_size) == (3, 8, 1, 4)
    assert cfg.master_addr == "10.1.2.3" and cfg.port == 29501
    assert not cfg.host_server and cfg.launcher == "torchrun"
    assert detect({**env, "RANK": "0"}).host_server
    assert detect({**env, "MINIDIST_PORT": "4000"}).port == 4000
    # every rank of the job derives the same secret; another job a different one
    assert detect({**env, "RANK": "0"}).secret == cfg.secret
    assert detect({**env, "TORCHELASTIC_RUN_ID": "other"}).secret != cfg.secret
    assert detect({**env, "MINIDIST_SECRET": "s3"}).secret == b"s3"


def test_minidist_launcher_never_hosts():
    env = {"MINIDIST_LAUNCHER": "1", "MINIDIST_ADDR": "127.0.0.1", "MINIDIST_PORT": "4100",
           "MINIDIST_SECRET": "xyz", "RANK": "0", "WORLD_SIZE": "2", "LOCAL_RANK": "0",
           "LOCAL_WORLD_SIZE": "2"}
    cfg = detect(env)
    assert cfg.port == 4100 and cfg.secret == b"xyz" and not cfg.host_server


def test_slurm():
    env = {"SLURM_PROCID": "5", "SLURM_NTASKS": "8", "SLURM_LOCALID": "1",
           "SLURM_NTASKS_PER_NODE": "4", "SLURM_NNODES": "2", "SLURM_NODELIST": "gpu[07-08]",
           "SLURM_JOB_ID": "1234"}
    cfg = detect(env)
    assert (cfg.rank, cfg.world_size, cfg.local_rank, cfg.local_world_size) == (5, 8, 1, 4)
    assert cfg.master_addr == "gpu07" and cfg.launcher == "slurm"
    assert cfg.port == DEFAULT_PORT + 2 + 234
    assert slurm_first_host("a1,b2") == "a1"
    assert slurm_first_host("n[3,5-6]") == "n3"


def test_open_mpi():
    env = {"OMPI_COMM_WORLD_RANK": "2", "OMPI_COMM_WORLD_SIZE": "4",
           "OMPI_COMM_WORLD_LOCAL_RANK": "2", "OMPI_COMM_WORLD_LOCAL_SIZE": "4",
           "OMPI_MCA_ess_base_jobid": "777"}
    cfg = detect(env)
    assert (cfg.rank, cfg.world_size, cfg.launcher) == (2, 4, "mpirun")
    assert cfg.master_addr == "127.0.0.1"
    assert detect({**env, "OMPI_COMM_WORLD_RANK": "0"}).port == cfg.port


def test_explicit_overrides():
    cfg = detect({}, rank=1, world_size=3, master_addr="127.0.0.1", master_port=5000)
    assert (cfg.rank, cfg.world_size, cfg.port, cfg.host_server) == (1, 3, 5000, False)
    assert detect({}, rank=0, world_size=3, master_port=5000).host_server


@pytest.mark.parametrize("env, kw", [
    ({"RANK": "4", "WORLD_SIZE": "4"}, {}),
    ({"RANK": "x", "WORLD_SIZE": "4"}, {}),
    ({}, {"rank": 1}),
    ({}, {"rank": 0, "world_size": 0}),
])
def test_bad_environments_are_clear_errors(env, kw):
    with pytest.raises(ValueError):
        detect(env, **kw)


def test_slurm_without_tasks_per_node_divides_by_nodes():
    env = {"SLURM_PROCID": "5", "SLURM_NTASKS": "8", "SLURM_LOCALID": "1",
           "SLURM_NNODES": "2", "SLURM_NODELIST": "rack[1-2]-node[01-04]"}
    cfg = detect(env)
    assert cfg.local_world_size == 4 and cfg.master_addr == "rack1-node01"
    assert detect({**env, "SLURM_PROCID": "4", "SLURM_LOCALID": "0"}).host_agent


def test_several_nodes_without_an_address_is_a_clear_error():
    env = {"OMPI_COMM_WORLD_RANK": "0", "OMPI_COMM_WORLD_SIZE": "8",
           "OMPI_COMM_WORLD_LOCAL_RANK": "0", "OMPI_COMM_WORLD_LOCAL_SIZE": "4"}
    with pytest.raises(ValueError, match="MASTER_ADDR"):
        detect(env)
    assert detect({**env, "MASTER_ADDR": "10.0.0.1"}).master_addr == "10.0.0.1"
