"""minidist as a Ray collective backend: ``backend="minidist"`` in ``ray.util.collective``.

Importing this module registers the backend (``register_collective_backend``) in this
process; import it in the driver and in every actor (the module that defines the
actors normally does). Then, in each actor::

    import ray.util.collective as col
    import minidist.ray  # noqa: F401  (registers "minidist")

    col.init_collective_group(world_size, rank, backend="minidist", group_name="all")
    col.allreduce(array, group_name="all")

Ray groups are served as follows (``docs/ray.md``):

* the first Ray group of a set of actors starts a minidist job whose world is that
  group: rank 0 hosts the rendezvous on a free port, and its address and secret travel
  through Ray's internal key/value store;
* a later Ray group whose actors all belong to one job already is a group of that
  job: no socket, no port;
* a Ray group with an actor outside every shared job starts a job of its own (an actor
  may then hold several jobs, each with its own connections).

Numpy arrays and CPU torch tensors; a dead actor makes every rank waiting on it raise
:class:`minidist.PeerLostError` within seconds.
"""

from __future__ import annotations

try:
    import ray  # noqa: F401
    from ray.util.collective.backend_registry import register_collective_backend
    from ray.util.collective.collective_group.base_collective_group import (  # noqa: F401
        BaseGroup,
    )
except ImportError as e:  # pragma: no cover - depends on the environment
    raise ImportError(
        "minidist.ray needs Ray with ray.util.collective.backend_registry (Ray 2.60 or "
        f"newer): pip install 'minidist[ray]' ({e})") from e

from ._bootstrap import jobs as _jobs
from ._group import BACKEND, MinidistGroup, get_timeout, set_timeout

__all__ = ["BACKEND", "MinidistGroup", "describe", "get_timeout", "register", "set_timeout"]


def register() -> None:
    """Register the "minidist" backend with ``ray.util.collective`` (idempotent; done
    on import)."""
    try:
        register_collective_backend(BACKEND, MinidistGroup)
    except ValueError:  # already registered in this process
        pass


def describe() -> list[dict]:
    """The minidist jobs this process belongs to, for diagnostics: per job its public
    key, this process's rank and size in it, whether this process hosts its rendezvous,
    and the names of this process's Ray groups on it."""
    return [{"job": j.door.job, "rank": j.door.rank, "size": j.door.world.size,
             "hosts": j.hosts, "groups": sorted(j.groups)} for j in _jobs()]


register()
