"""The blocking calls that keep a job going when ranks die: shrink_group, agree,
wait_ranks (the same names are awaitable in :mod:`minidist.aio`), made from their
definitions in :mod:`minidist.calls`."""

from __future__ import annotations

from . import calls
from .api import ELASTIC, SHAPES, GroupArg, door  # noqa: F401 - the made functions name them
from .group import Group  # noqa: F401 - their annotations name it

calls.make(globals(), "api", SHAPES, "Work", [calls.CALLS[name] for name in ELASTIC])
