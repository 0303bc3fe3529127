"""Type stubs of minidist.elastic_api, written by ``python -m tests.unit.stubs`` from the module and
the definitions of its made functions (minidist.calls): do not edit."""

from __future__ import annotations as annotations
from . import calls as calls
from .api import ELASTIC as ELASTIC, SHAPES as SHAPES, GroupArg as GroupArg, door as door
from .group import Group as Group

def shrink_group(ranks_to_exclude: list[int] | None = None, group: GroupArg = None) -> Group: ...

def agree(flag: bool, group: GroupArg = None) -> bool: ...

def wait_ranks(ranks: list[int], timeout: float | None = None) -> list[int]: ...
