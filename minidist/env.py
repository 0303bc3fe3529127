"""Reads the environment a launcher leaves (minidist run, torchrun, Slurm, Open MPI).

Pure: a function of a mapping, so it is tested without launching anything.
"""

from __future__ import annotations

import hashlib
import re
from collections.abc import Mapping
from dataclasses import dataclass

DEFAULT_PORT = 29500
DEFAULT_TIMEOUT = 300.0


def default_timeout(env: Mapping[str, str]) -> float:
    """Seconds every call may take when no timeout is given: ``MINIDIST_TIMEOUT`` or 300."""
    return float(env.get("MINIDIST_TIMEOUT", DEFAULT_TIMEOUT))


# The switches minidist reads from the environment besides the launch itself; every
# MINIDIST_* variable is listed, with its default, in docs/environment.md.


def algorithm_overrides(env: Mapping[str, str], collectives: list[str]) -> dict[str, str]:
    """Per-job algorithm choices: ``MINIDIST_ALGO_<COLLECTIVE>`` (e.g. ``..._ALL_REDUCE``)."""
    return {c: env[f"MINIDIST_ALGO_{c.upper()}"] for c in collectives
            if env.get(f"MINIDIST_ALGO_{c.upper()}")}


def algorithm_modules(env: Mapping[str, str]) -> list[str]:
    """``MINIDIST_ALGO_MODULE``: modules of algorithms of your own that every rank imports
    at init (comma-separated; empty for none)."""
    return [m.strip() for m in env.get("MINIDIST_ALGO_MODULE", "").split(",") if m.strip()]


def shared_memory_allowed(env: Mapping[str, str]) -> bool:
    """False with ``MINIDIST_SHM=0``: no shared-memory algorithms."""
    return env.get("MINIDIST_SHM", "1") != "0"


def fast_path_allowed(env: Mapping[str, str]) -> bool:
    """False with ``MINIDIST_FASTPATH=0``: small calls on one node go through sockets."""
    return env.get("MINIDIST_FASTPATH", "1") != "0"


def single_copy_allowed(env: Mapping[str, str]) -> bool:
    """False with ``MINIDIST_SINGLE_COPY=0``: ranks of one node never read each other's
    memory (large all_reduces go through shared segments instead)."""
    return env.get("MINIDIST_SINGLE_COPY", "1") != "0"


def uvloop_allowed(env: Mapping[str, str]) -> bool:
    """False with ``MINIDIST_UVLOOP=0``: the standard asyncio loop even with uvloop."""
    return env.get("MINIDIST_UVLOOP", "1") != "0"


def trace_dir(env: Mapping[str, str]) -> str | None:
    """``MINIDIST_TRACE``: the directory where every rank writes a trace of its
    collectives (``<job>-rank<R>.json``); unset or empty: no tracing."""
    return env.get("MINIDIST_TRACE") or None


def advertise_addr(env: Mapping[str, str]) -> str | None:
    """``MINIDIST_ADVERTISE_ADDR``: where other nodes reach this node's agent."""
    return env.get("MINIDIST_ADVERTISE_ADDR") or None


def calibration_file(env: Mapping[str, str], home: str) -> str:
    """``MINIDIST_CALIBRATION``, else ``<home>/.cache/minidist/calibration.json``."""
    return env.get("MINIDIST_CALIBRATION") or f"{home}/.cache/minidist/calibration.json"


def start_method(env: Mapping[str, str]) -> str:
    """``MINIDIST_START_METHOD`` for ``minidist run``: ``fork`` (default) or ``spawn``."""
    return env.get("MINIDIST_START_METHOD", "fork")


def log_level(env: Mapping[str, str]) -> str | None:
    """``MINIDIST_LOG_LEVEL`` (``DEBUG``, ``INFO``, ``WARNING``, ...): where minidist's own
    log messages start to be printed to stderr; unset leaves logging to the program."""
    v = env.get("MINIDIST_LOG_LEVEL", "").strip().upper()
    return v or None


def given_secret(env: Mapping[str, str]) -> str | None:
    """``MINIDIST_SECRET``: the job secret a launcher was given."""
    return env.get("MINIDIST_SECRET") or None


@dataclass(frozen=True)
class LaunchConfig:
    """Where this process stands in the job and how to reach the rendezvous.

    ``port`` is minidist's own port (never torchrun's MASTER_PORT itself): the
    rendezvous' on the first node and every other node's agent port. ``host_server``
    says whether this process must start the rendezvous server, ``host_agent`` whether
    it must start its node's agent (local rank 0 of a node other than the first, when no
    minidist launcher runs there).
    """

    rank: int
    world_size: int
    local_rank: int
    local_world_size: int
    master_addr: str
    port: int
    secret: bytes
    host_server: bool
    launcher: str
    host_agent: bool = False
    # no MINIDIST_SECRET was given, so ``secret`` is derived from public variables:
    # ``share_secret`` (every rank on this node) rank 0 draws a random one and the
    # others read it from a file only this user can read (minidist.job_secret);
    # ``public_secret`` (several nodes) the derived one is used, with a warning
    share_secret: bool = False
    public_secret: bool = False


def _int(env: Mapping[str, str], *names: str, default: int | None = None) -> int | None:
    for n in names:
        v = env.get(n)
        if v not in (None, ""):
            try:
                return int(v)
            except ValueError:
                raise ValueError(f"environment variable {n}={v!r} is not an integer") from None
    return default


def _derived_secret(*parts: object) -> bytes:
    return hashlib.sha256("\x00".join(map(str, parts)).encode()).digest()


def _secret(env: Mapping[str, str], *fallback: object) -> bytes:
    s = env.get("MINIDIST_SECRET")
    if s:
        return s.encode()
    return _derived_secret("minidist", *fallback)


def slurm_first_host(nodelist: str) -> str:
    """The first host name of a Slurm node list such as ``node[03-05,7],gpu1`` or
    ``rack[1-2]-node[01-04]`` (the first value of every bracket group)."""
    text = nodelist.strip()
    if not text:
        raise ValueError("empty SLURM_NODELIST")
    out, i = [], 0
    while i < len(text):
        ch = text[i]
        if ch == ",":
            break
        if ch == "[":
            end = text.find("]", i)
            if end < 0:
                raise ValueError(f"cannot parse SLURM_NODELIST {nodelist!r}")
            out.append(re.split(r"[,-]", text[i + 1:end])[0])
            i = end + 1
            continue
        out.append(ch)
        i += 1
    return "".join(out)


def _slurm_local_size(env: Mapping[str, str], world: int, nnodes: int) -> int:
    v = (env.get("SLURM_STEP_TASKS_PER_NODE") or env.get("SLURM_NTASKS_PER_NODE")
         or env.get("SLURM_TASKS_PER_NODE") or "")
    m = re.match(r"(\d+)", v)
    return int(m.group(1)) if m else -(-world // max(1, nnodes))


def detect(env: Mapping[str, str], *, rank: int | None = None, world_size: int | None = None,
           master_addr: str | None = None, master_port: int | None = None) -> LaunchConfig:
    """The launch configuration from ``env`` and explicit overrides.

    Order: explicit arguments, then minidist's launcher, torchrun, Slurm, Open MPI; with
    none of them a world of one. Under torchrun MASTER_PORT is held by torchrun's own
    store, so minidist listens on MINIDIST_PORT, or MASTER_PORT + 1 when that is unset.
    """
    port_env = _int(env, "MINIDIST_PORT")
    if "MINIDIST_LAUNCHER" in env:
        launcher = "minidist"
        r = _int(env, "RANK")
        ws = _int(env, "WORLD_SIZE")
        lr = _int(env, "LOCAL_RANK", default=r)
        lws = _int(env, "LOCAL_WORLD_SIZE", default=ws)
        addr = env.get("MINIDIST_ADDR", "127.0.0.1")
        port = port_env or DEFAULT_PORT
        host = False
        secret = _secret(env, "minidist-run", addr, port)
    elif "RANK" in env and "WORLD_SIZE" in env:
        launcher = "torchrun" if "TORCHELASTIC_RUN_ID" in env or "MASTER_PORT" in env else "env"
        r = _int(env, "RANK")
        ws = _int(env, "WORLD_SIZE")
        lr = _int(env, "LOCAL_RANK", default=r)
        lws = _int(env, "LOCAL_WORLD_SIZE", default=ws)
        addr = env.get("MASTER_ADDR", "127.0.0.1")
        mp = _int(env, "MASTER_PORT")
        port = port_env or (mp + 1 if mp else DEFAULT_PORT + 1)
        host = r == 0
        secret = _secret(env, "torchrun", addr, mp, env.get("TORCHELASTIC_RUN_ID", ""))
    elif "SLURM_PROCID" in env and "SLURM_NTASKS" in env:
        launcher = "slurm"
        r = _int(env, "SLURM_PROCID")
        ws = _int(env, "SLURM_NTASKS")
        lr = _int(env, "SLURM_LOCALID", default=r)
        nnodes = _int(env, "SLURM_STEP_NUM_NODES", "SLURM_NNODES", "SLURM_JOB_NUM_NODES",
                      default=1)
        lws = _slurm_local_size(env, ws, nnodes)
        nodelist = env.get("SLURM_STEP_NODELIST") or env.get("SLURM_NODELIST") or ""
        addr = env.get("MASTER_ADDR") or (
            slurm_first_host(nodelist) if nnodes > 1 and nodelist else "127.0.0.1")
        job = _int(env, "SLURM_JOB_ID", "SLURM_JOBID", default=0)
        step = env.get("SLURM_STEP_ID", "")
        port = port_env or _int(env, "MASTER_PORT") or DEFAULT_PORT + 2 + job % 1000
        host = r == 0
        secret = _secret(env, "slurm", job, step, addr)
    elif "OMPI_COMM_WORLD_RANK" in env and "OMPI_COMM_WORLD_SIZE" in env:
        launcher = "mpirun"
        r = _int(env, "OMPI_COMM_WORLD_RANK")
        ws = _int(env, "OMPI_COMM_WORLD_SIZE")
        lr = _int(env, "OMPI_COMM_WORLD_LOCAL_RANK", default=r)
        lws = _int(env, "OMPI_COMM_WORLD_LOCAL_SIZE", default=ws)
        addr = env.get("MASTER_ADDR") or "127.0.0.1"
        jobid = env.get("OMPI_MCA_ess_base_jobid") or env.get("PMIX_NAMESPACE") or ""
        port = port_env or _int(env, "MASTER_PORT") or (
            DEFAULT_PORT + 2 + int(hashlib.sha256(jobid.encode()).hexdigest(), 16) % 1000)
        host = r == 0
        secret = _secret(env, "mpirun", jobid, addr)
    else:
        launcher = "none"
        r, ws, lr, lws = 0, 1, 0, 1
        addr = env.get("MASTER_ADDR", "127.0.0.1")
        port = port_env or DEFAULT_PORT
        host = True
        secret = _secret(env, "single", addr, port)

    if rank is not None or world_size is not None:
        if world_size is None or rank is None:
            raise ValueError("init(rank=..., world_size=...) needs both")
        if launcher == "none":
            launcher = "explicit"
            lr, lws = rank, world_size
            host = rank == 0
            secret = _secret(env, "explicit", master_addr or addr, master_port or port)
        r, ws = rank, world_size
        host = host if launcher == "minidist" else r == 0
    if master_addr is not None:
        addr = master_addr
    if master_port is not None:
        port = master_port
    assert r is not None and ws is not None and lr is not None and lws is not None
    if ws < 1:
        raise ValueError(f"world size must be at least 1, got {ws}")
    if not 0 <= r < ws:
        raise ValueError(f"rank {r} is outside 0..{ws - 1}")
    agent = launcher not in ("minidist", "none") and lr == 0 and not host and lws < ws
    derived = not env.get("MINIDIST_SECRET") and launcher not in ("minidist", "none")
    one_node = lws == ws and (launcher != "explicit" or addr in ("127.0.0.1", "localhost"))
    if launcher == "slurm":
        one_node = one_node and nnodes == 1
    if lws < ws and addr in ("127.0.0.1", "localhost") and launcher in ("slurm", "mpirun"):
        raise ValueError(f"this {launcher} job spans several nodes ({lws} of {ws} ranks "
                         "here): set MASTER_ADDR to the address of the node of rank 0")
    return LaunchConfig(r, ws, lr, lws, addr, port, secret, host, launcher, agent,
                        share_secret=derived and one_node and ws > 1,
                        public_secret=derived and not one_node)
