"""The blocking public functions: init, destroy, groups, collectives, the store.

They plan each call and pass it through this process's door (:mod:`minidist.door`),
whose session runs on a background event loop; the calling thread sleeps in the kernel
while a call is in flight. Each function is made from its definition in
:mod:`minidist.calls` (the catalog's collectives from their records, through
:mod:`minidist.facade`) and the blocking shape of its call in :data:`SHAPES`; ``init``,
``destroy``, ``is_initialized``, ``attach`` and ``get_store`` are written here.
"""

from __future__ import annotations

import concurrent.futures  # noqa: F401 - names that the made functions use
import os
from collections.abc import Sequence  # noqa: F401 - and their annotations name
from typing import Any

import numpy as np  # noqa: F401

from . import calls, facade, objects, startup  # noqa: F401
from .door import Door
from .env import default_timeout, detect
from .group import Group
from .kvstore import Store
from .ops import ReduceOp  # noqa: F401
from .process_state import STATE
from .shm import repeat  # noqa: F401
from .work import Work  # noqa: F401

GroupArg = Group | object | None

door = STATE.door
"""This process's door (see :mod:`minidist.door`): how layers built on minidist
(``minidist.torch``) plan and start calls. DistError if not initialized."""


SHAPES: dict[str, str] = {
    calls.COLLECTIVE: '''
def {name}({params}) -> {returns}:
    d = door()
    item = {plan}
    if async_op:
        return Work(d.submit(item))
    d.wait(item)
    return None
''',
    # a blocking scatter or gather that repeats the last such call runs planned once
    # (minidist.shm.repeat), and one that took the fast path is remembered
    calls.ROOTED: '''
def {name}({params}) -> {returns}:
    if not async_op and algorithm is None and repeat.again(
            STATE.blocking, "{name}", output, input, {root}, group):
        return None
    d = door()
    item = {plan}
    if async_op:
        return Work(d.submit(item))
    d.wait(item)
    if algorithm is None:
        repeat.remember(d, item, group, output, input)
    return None
''',
    calls.START: '''
def {name}({params}) -> {returns}:
    d = door()
    return Work(d.submit({plan}))
''',
    calls.FINISH: '''
def {name}({params}) -> {returns}:
    d = door()
    d.wait({plan})
''',
    # a blocking send like the last one to the same rank goes without planning it again
    calls.SEND: '''
def {name}({params}) -> {returns}:
    d = door()
    if d.send_again(array, dst, tag, group):
        return
    d.wait({plan})
''',
    calls.START_RECV: '''
def {name}({params}) -> {returns}:
    d = door()
    item = {plan}
    return Work(d.submit(item), source=lambda: item.source)
''',
    # a blocking receive like the last one from the same rank goes without planning it
    calls.RECV: '''
def {name}({params}) -> {returns}:
    d = door()
    if src is not None and d.recv_again(array, src, tag, group):
        return src
    item = {plan}
    d.wait(item)
    return item.source
''',
    # a blocking recv_many like the last one on this thread runs planned once
    calls.MANY: '''
def {name}({params}) -> {returns}:
    d = door()
    if not async_op:
        m = d.many_again(output, src, tag, group)
        if m is not None:
            return d.wait_many(m)
    m = {plan}
    if async_op:
        return Work(d.submit_many(m))
    return d.wait_many(m)
''',
    calls.RECV_OBJECT: '''
def {name}({params}) -> {returns}:
    d = door()
    item = {plan}
    obj = objects.loads(d.wait(item))
    return (obj, item.source) if return_source else obj
''',
    calls.START_RECV_OBJECT: '''
def {name}({params}) -> {returns}:
    d = door()
    item = {plan}
    raw = d.submit(item)
    done = concurrent.futures.Future()

    def unpickle(f):
        if f.cancelled() or f.exception() is not None:
            done.set_exception(f.exception() or concurrent.futures.CancelledError())
            return
        try:
            done.set_result(objects.loads(f.result()))
        except Exception as e:  # an object that does not unpickle
            done.set_exception(e)

    raw.add_done_callback(unpickle)
    return Work(done, source=lambda: item.source)
''',
    calls.LOOP: '''
def {name}({params}) -> {returns}:
    d = door()
    return d.block({plan})
''',
    calls.STEPS: '''
def {name}({params}) -> {returns}:
    d = door()
    return d.steps({plan})
''',
    calls.QUERY: '''
def {name}({params}) -> {returns}:
    d = door()
    return {plan}
''',
}
"""How a blocking call runs, by shape (:mod:`minidist.calls`): source text formatted with
a definition's ``name``, ``params``, ``returns``, ``plan`` (``d`` is the door) and
``root``."""

ELASTIC = ("shrink_group", "agree", "wait_ranks")
"""The calls whose blocking functions live in :mod:`minidist.elastic_api`."""


# ---------------------------------------------------------------------- written here


def init(*, rank: int | None = None, world_size: int | None = None,
         master_addr: str | None = None, master_port: int | None = None,
         timeout: float | None = None) -> None:
    def start() -> Door:
        cfg = detect(os.environ, rank=rank, world_size=world_size, master_addr=master_addr,
                     master_port=master_port)
        return startup.start(cfg, default_timeout(os.environ) if timeout is None else timeout)

    STATE.join(start)


def attach(d: Door) -> None:
    """Make a door that a layer above started itself (``minidist.torch`` joins from
    torch's store) this process's door, as after :func:`init`."""
    STATE.join(lambda: d)


def destroy() -> None:
    STATE.leave()


def is_initialized() -> bool:
    return STATE.blocking is not None


def get_store() -> Store:
    """The job's key/value store."""
    return Store(door())


# ---------------------------------------------------------------------- made from calls

calls.make(globals(), "api", SHAPES, "Work",
           [c for c in calls.CALLS.values() if c.name not in ELASTIC])

GENERATED: dict[str, Any] = calls.make(globals(), "api", SHAPES, "Work", facade.definitions())
"""The functions of the collectives whose records carry a front end (minidist.scan, ...)."""
