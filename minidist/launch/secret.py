"""The job secret of ``minidist run``: given (MINIDIST_SECRET or ``--secret-file``),
else random on one node, else derived from public options on several nodes (their
launchers must agree without talking), which the first node warns about once."""

from __future__ import annotations

import hashlib
import os
import secrets
from collections.abc import Mapping

from ..env import given_secret
from .options import RunOptions


def launcher_secret(opts: RunOptions, environ: Mapping[str, str] = os.environ
                    ) -> tuple[str, bool]:
    """(the job's secret, whether anyone can compute it). ValueError if ``--secret-file``
    cannot be read, is empty, or may be read by group or others."""
    secret = secret_from_file(opts.secret_file) if opts.secret_file else \
        given_secret(environ)
    public = secret is None and opts.nnodes > 1
    if secret is None:
        # the nodes' launchers must agree without talking: derived, so not secret
        # (a warning says so once the job starts)
        secret = hashlib.sha256(
            f"minidist:{opts.master_addr}:{opts.master_port}".encode()).hexdigest() \
            if opts.nnodes > 1 else secrets.token_hex(16)
    return secret, public


def public_secret_warning(opts: RunOptions, public: bool) -> str | None:
    """The warning the first node's launcher prints once when the job's secret is
    derived from public options (several nodes, no secret given); else None."""
    if not public or opts.node_rank != 0:
        return None
    return ("warning: no MINIDIST_SECRET or --secret-file: this job's secret is "
            "derived from --master-addr and --master-port, which anyone can compute, "
            "so its port keeps no stranger out. Give every node's launcher the same "
            "random secret: --secret-file PATH (e.g. made with `python -c \"import "
            "secrets; print(secrets.token_hex(32))\" > PATH; chmod 600 PATH`) or "
            "MINIDIST_SECRET")


def secret_from_file(path: str) -> str:
    """The job secret in ``path`` (its first line, stripped). ValueError if it is empty,
    or if the file is readable by group or others (a secret they could read)."""
    try:
        st = os.stat(path)
        with open(path) as f:
            secret = f.readline().strip()
    except OSError as e:
        raise ValueError(f"--secret-file {path}: {e.strerror}") from None
    if st.st_mode & 0o077:
        raise ValueError(f"--secret-file {path} has mode {st.st_mode & 0o777:o}: other "
                         f"users may read it; chmod 600 {path}")
    if not secret:
        raise ValueError(f"--secret-file {path} is empty")
    return secret
