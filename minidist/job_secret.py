"""A job secret nobody else can compute, for jobs launched without ``MINIDIST_SECRET``.

torchrun, mpirun and Slurm give minidist no secret; the one it could derive from their
variables (``MASTER_ADDR``, ``MASTER_PORT``, the run id) is known to anyone who can see
them (any local user, with ``ps``). So when every rank of the job is on this node (the
launch variables say so: see :attr:`minidist.env.LaunchConfig.share_secret`):

* rank 0 draws a random secret and writes it to a file only this user can read: mode
  0600, in a directory of this user's of mode 0700 (``$XDG_RUNTIME_DIR/minidist`` when
  that is such a directory, else ``/tmp/minidist-<uid>``; a directory owned by anyone
  else, or open to group or others, is refused), named for the job (a digest of the
  derived secret, and the how-manieth ``init`` of this process it is), written whole
  (a temporary name, then a rename);
* the other ranks wait for that file (up to the init timeout), check its owner and mode
  and that its writer is alive, and read it;
* rank 0 removes it once every rank has joined (they have all read it), or when its
  init fails.

On several nodes no file can reach the other nodes: the derived secret is used, and
rank 0 warns once that it is public and how to set one (:func:`warn_public`).
"""

from __future__ import annotations

import contextlib
import dataclasses
import hashlib
import json
import logging
import os
import secrets
import stat
import time
from collections.abc import Mapping

from .env import LaunchConfig
from .errors import DistError, DistTimeoutError

log = logging.getLogger("minidist.secret")

POLL = 0.01  # seconds between looks for rank 0's file
_inits = 0  # this process's shared-secret inits so far: the file's generation
_written: set[str] = set()  # files this process wrote and has not removed yet
_warned: set[bytes] = set()  # jobs already warned about (once per job and process)


class SecretFileError(DistError):
    """The job secret could not be handed out safely (a directory or file another user
    could read or own), or rank 0's file never came."""


def directory(env: Mapping[str, str] | None = None) -> str:
    """The directory for job secrets, created if needed and checked: this user's own,
    mode 0700. SecretFileError if it is anyone else's or open to group or others."""
    environ = os.environ if env is None else env
    uid = os.geteuid()
    runtime = environ.get("XDG_RUNTIME_DIR")
    if runtime and _private_dir(runtime, uid, create=False):
        path = os.path.join(runtime, "minidist")
    else:
        path = os.path.join("/tmp", f"minidist-{uid}")
    _private_dir(path, uid, create=True)
    return path


def _private_dir(path: str, uid: int, create: bool) -> bool:
    """True if ``path`` is a directory (not a link) of ``uid`` with no group or other
    bits. With ``create``, make it (mode 0700) when missing, and raise SecretFileError
    instead of returning False."""
    if create:
        with contextlib.suppress(FileExistsError):
            os.mkdir(path, 0o700)
    try:
        st = os.lstat(path)
    except OSError:
        if create:
            raise
        return False
    problem = None
    if not stat.S_ISDIR(st.st_mode):
        problem = "is not a directory"
    elif st.st_uid != uid:
        problem = f"belongs to uid {st.st_uid}, not to this user (uid {uid})"
    elif st.st_mode & 0o077:
        problem = f"has mode {stat.S_IMODE(st.st_mode):o}: group or others may look in"
    if problem is None:
        return True
    if create:
        raise SecretFileError(
            f"refusing to hand out the job secret through {path}: it {problem}. Remove "
            "it (minidist makes it again, mode 0700), or set MINIDIST_SECRET to the same "
            "random value for every rank")
    return False


def file_for(cfg: LaunchConfig, generation: int, env: Mapping[str, str] | None = None) -> str:
    """The file that carries the secret of ``cfg``'s job, ``generation``-th init."""
    digest = hashlib.sha256(b"minidist-secret-file\0" + cfg.secret).hexdigest()[:32]
    return os.path.join(directory(env), f"job-{digest}-{generation}")


def resolve(cfg: LaunchConfig, timeout: float) -> LaunchConfig:
    """``cfg`` with the secret its ranks will use. Unless ``cfg.share_secret``, that is
    the given (or derived) one, after a warning if it is public. Otherwise rank 0 writes
    a random one (removed by :func:`joined`) and the others wait up to ``timeout`` for it
    (SecretFileError / DistTimeoutError)."""
    global _inits
    if not cfg.share_secret:
        if cfg.public_secret and cfg.host_server:
            warn_public(cfg)
        return cfg
    _inits += 1
    path = file_for(cfg, _inits)
    if cfg.rank == 0:
        secret = secrets.token_hex(32)
        _write(path, secret)
    else:
        secret = _wait_for(path, cfg, timeout)
    return dataclasses.replace(cfg, secret=secret.encode(), share_secret=False)


def _write(path: str, secret: str) -> None:
    body = json.dumps({"secret": secret, "pid": os.getpid()}).encode()
    tmp = f"{os.path.dirname(path)}/.{os.path.basename(path)}.{os.getpid()}." \
          f"{secrets.token_hex(4)}"
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_CLOEXEC,
                 0o600)
    try:
        os.fchmod(fd, 0o600)
        os.write(fd, body)
    finally:
        os.close(fd)
    try:
        os.rename(tmp, path)
    except BaseException:
        with contextlib.suppress(OSError):
            os.unlink(tmp)
        raise
    _written.add(path)


def _wait_for(path: str, cfg: LaunchConfig, timeout: float) -> str:
    end = time.monotonic() + timeout
    why = "no file yet"
    while True:
        secret, why = _read(path, why)
        if secret is not None:
            return secret
        if time.monotonic() > end:
            raise DistTimeoutError(
                f"rank {cfg.rank}: the job secret that rank 0 hands out in {path} did not "
                f"come within {timeout:g} s ({why}); is rank 0 running, as the same user, "
                "on this node? (Setting MINIDIST_SECRET to the same random value for "
                "every rank skips this.)", collective="init")
        time.sleep(POLL)


def _read(path: str, why: str) -> tuple[str | None, str]:
    """(the secret in ``path``, "") or (None, why not yet). SecretFileError for a file
    that another user could have written or read."""
    try:
        fd = os.open(path, os.O_RDONLY | os.O_NOFOLLOW | os.O_CLOEXEC)
    except FileNotFoundError:
        return None, why
    try:
        st = os.fstat(fd)
        if st.st_uid != os.geteuid() or st.st_mode & 0o077 or not stat.S_ISREG(st.st_mode):
            raise SecretFileError(f"refusing the job secret in {path}: it belongs to uid "
                                  f"{st.st_uid} with mode {stat.S_IMODE(st.st_mode):o}")
        data = os.read(fd, 4096)
    finally:
        os.close(fd)
    try:
        body = json.loads(data)
        secret, pid = str(body["secret"]), int(body["pid"])
    except (ValueError, KeyError, TypeError):
        return None, "an unreadable file"  # never half-written (renamed into place)
    try:
        os.kill(pid, 0)
    except ProcessLookupError:  # left by a rank 0 that died: the new one replaces it
        return None, f"a file left by process {pid}, which has exited"
    except PermissionError:
        pass
    return secret, ""


def joined(cfg: LaunchConfig) -> None:
    """This rank joined (every rank has read the secret) or gave up: remove the file it
    wrote, if any."""
    for path in list(_written):
        with contextlib.suppress(FileNotFoundError):
            os.unlink(path)
        _written.discard(path)


def warn_public(cfg: LaunchConfig) -> None:
    """Warn, once per job, that the job's secret is derived from public variables."""
    if cfg.secret in _warned:
        return
    _warned.add(cfg.secret)
    log.warning(
        "this job (%s, %d ranks on several nodes) has no MINIDIST_SECRET: its secret is "
        "derived from MASTER_ADDR, MASTER_PORT and the run id, which anyone who can see "
        "them can compute, so the port does not keep strangers out. Set MINIDIST_SECRET "
        "to the same random value on every node (e.g. from `python -c \"import secrets; "
        "print(secrets.token_hex(32))\"`), or use minidist run --secret-file",
        cfg.launcher, cfg.world_size)
