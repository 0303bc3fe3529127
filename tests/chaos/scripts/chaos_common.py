"""What the chaos scripts share: their parameters, one parseable line per outcome, gates.

Every line a script prints for the test is ``EVENT what=... key=value ...`` or
``RESULT rank=R kind=Class ... msg="json string"``; ``t`` is ``time.monotonic()``, which
on Linux is one clock for every process of the machine, so the test can subtract the
moment it sent a signal.
"""

from __future__ import annotations

import json
import os
import sys
import time

import minidist


def params() -> dict:
    """The scenario's parameters: one JSON object, the script's first argument."""
    return json.loads(sys.argv[1]) if len(sys.argv) > 1 else {}


def now() -> float:
    return time.monotonic()


def _fmt(v: object) -> str:
    if isinstance(v, float):
        return f"{v:.4f}"
    if isinstance(v, (list, tuple)):
        return "[" + ",".join(str(int(x)) for x in v) + "]"
    return str(v).replace(" ", "_") or "-"


def emit(tag: str, msg: str | None = None, **fields: object) -> None:
    parts = [tag, *(f"{k}={_fmt(v)}" for k, v in fields.items())]
    if msg is not None:
        parts.append("msg=" + json.dumps(msg))
    print(" ".join(parts), flush=True)


def event(what: str, **fields: object) -> None:
    emit("EVENT", what=what, pid=os.getpid(), t=now(), **fields)


class WrongResult(Exception):
    """A collective returned, but not the right numbers."""


def result(rank: int, err: BaseException | None, **fields: object) -> None:
    """One outcome: ``kind=none`` for no error, else the error's class, ``.ranks``,
    ``.left``, ``.missing`` and message."""
    if err is None:
        emit("RESULT", rank=rank, kind="none", dist=False, t=now(), **fields)
        return
    left = getattr(err, "left", None)
    emit("RESULT", str(err), rank=rank, kind=type(err).__name__,
         dist=isinstance(err, minidist.DistError),
         ranks=list(getattr(err, "ranks", ()) or ()),
         left="-" if left is None else bool(left),
         missing=list(getattr(err, "missing", ()) or ()), t=now(), **fields)


def wait_gate(path: str | None, timeout: float = 60.0) -> bool:
    """Wait until the test creates ``path`` (True), or ``timeout`` passes (False)."""
    if not path:
        return True
    end = now() + timeout
    while not os.path.exists(path):
        if now() > end:
            return False
        time.sleep(0.02)
    return True
