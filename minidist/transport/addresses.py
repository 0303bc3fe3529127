"""Where processes and agents of a job listen on one node."""

from __future__ import annotations

import hashlib
import sys

# Linux abstract Unix sockets: no file to leave behind, and one namespace per network
# namespace, which is exactly "one node" for emulated hosts.
ABSTRACT = sys.platform.startswith("linux")


def job_key(secret: bytes) -> str:
    """A short public name for a job, derived from (never revealing) its secret."""
    return hashlib.sha256(b"minidist-job:" + secret).hexdigest()[:20]


def peer_address(job: str, rank: int) -> str | bytes:
    """The Unix-socket address on which global rank ``rank`` of job ``job`` listens."""
    return _address(f"minidist-{job}-r{rank}")


def agent_address(job: str) -> str | bytes:
    """The Unix-socket address of the job's agent on this node."""
    return _address(f"minidist-{job}-agent")


def _address(name: str) -> str | bytes:
    if ABSTRACT:
        return b"\0" + name.encode()
    import tempfile

    return f"{tempfile.gettempdir()}/{name}.sock"
