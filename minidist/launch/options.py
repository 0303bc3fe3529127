"""What ``minidist run`` was asked to do."""

from __future__ import annotations

from dataclasses import dataclass, field


@dataclass
class RunOptions:
    """What ``minidist run`` was asked to do.

    ``target`` is a script path (or a module name with ``module=True``) run with
    ``args``; ``command``, if given, replaces it with any command (spawn only).
    """

    nproc: int
    target: str = ""
    args: list[str] = field(default_factory=list)
    module: bool = False
    command: list[str] | None = None
    nnodes: int = 1
    node_rank: int = 0
    master_addr: str = "127.0.0.1"
    master_port: int = 0
    grace: float = 5.0
    prefix: bool = True
    log_dir: str | None = None  # also write each rank's output to <log_dir>/rank<k>.log
    secret_file: str | None = None  # the job secret, read from this file (--secret-file)
    start_method: str = "fork"
    env: dict[str, str] = field(default_factory=dict)
    restart_failed: int = 0  # times a rank that died (or raised) is started again
    verbose: bool = False  # at the end, say how much of /dev/shm the job held at most
