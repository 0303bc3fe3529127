"""Starting a rank again while the job runs (``minidist run --restart-failed N``).

The first ranks are forked before the launcher starts its event loop; a rank started
again is forked from a launcher that runs one (its rendezvous, its pipes, the other
ranks' pipes). The new process keeps nothing of that: its only descriptors are its
stdin (/dev/null), the ranks' stdout socket and its stderr pipe, its signals are as a
fresh interpreter's, and no event loop is running in it.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import resource
import signal
from collections.abc import Callable
from typing import Any

RESTART_COUNT = "MINIDIST_RESTART_COUNT"


def refork(launcher_pid: int, die_with: Callable[[int], None],
           run: Callable[[], int], stdout: int) -> tuple[int, int]:
    """Fork a rank from the running launcher; (pid, its stderr's read end). Its stdout
    is ``stdout`` (the output relay's socket). The child runs ``run()`` and exits with
    its code."""
    err_r, err_w = os.pipe()
    pid = os.fork()
    if pid:
        os.close(err_w)
        return pid, err_r
    code = 1
    try:
        os.setsid()
        die_with(launcher_pid)
        signal.set_wakeup_fd(-1)
        for sig in (signal.SIGCHLD, signal.SIGINT, signal.SIGTERM, signal.SIGHUP):
            signal.signal(sig, signal.SIG_DFL)
        asyncio.events._set_running_loop(None)  # the launcher's, frozen mid-call
        devnull = os.open(os.devnull, os.O_RDONLY)
        os.dup2(devnull, 0)
        os.dup2(stdout, 1)
        os.dup2(err_w, 2)
        # every other descriptor is the launcher's (listeners, ranks' connections, pipes)
        limit = resource.getrlimit(resource.RLIMIT_NOFILE)[0]
        os.closerange(3, limit if 0 < limit < (1 << 20) else 65536)
        code = run()
    finally:
        with contextlib.suppress(BaseException):
            os._exit(code)
    raise AssertionError("unreachable")  # pragma: no cover


def restart_env(count: int) -> dict[str, Any]:
    """What a rank started for the ``count``-th time again finds in its environment
    (torchelastic's TORCHELASTIC_RESTART_COUNT convention)."""
    return {RESTART_COUNT: str(count)}
