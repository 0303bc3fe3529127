"""What a vector env finds out and starts before its first call: its spaces and
metadata (from one env built in the caller's process, as gymnasium does), the checks of
its arguments, and its workers (processes of its own, or ranks of the running job)."""

from __future__ import annotations

import multiprocessing
from collections.abc import Callable, Sequence
from typing import Any

import numpy as np
from gymnasium import Env, Space
from gymnasium.error import CustomSpaceError
from gymnasium.vector.utils import batch_differing_spaces, batch_space, create_shared_memory

from . import _records as rec
from ._link import TAG_SETUP
from ._parent import Parent


def check_max_concurrency(value: Any) -> None:
    if value is None:
        return
    if not isinstance(value, (int, np.integer)):
        raise ValueError(f"`max_concurrency` must be an integer or None, got {type(value)}.")
    if value < 1:
        raise ValueError(f"`max_concurrency` must be a positive or None, got {value}.")


def describe(env_fns: Sequence[Callable[[], Env]], observation_mode: Any,
             autoreset_mode: Any) -> dict[str, Any]:
    """The vector env's metadata, render mode and spaces (gymnasium's rules)."""
    n = len(env_fns)
    dummy = env_fns[0]()
    try:
        metadata = dict(dummy.metadata)
        metadata["autoreset_mode"] = autoreset_mode
        out = {"metadata": metadata, "render_mode": dummy.render_mode,
               "single_action_space": dummy.action_space,
               "action_space": batch_space(dummy.action_space, n)}
        if isinstance(observation_mode, tuple) and len(observation_mode) == 2:
            if not isinstance(observation_mode[0], Space) or not isinstance(
                    observation_mode[1], Space):
                raise TypeError("Expected both elements of observation_mode to be Spaces, "
                                f"got {type(observation_mode[0])} and "
                                f"{type(observation_mode[1])}")
            out["observation_space"], out["single_observation_space"] = observation_mode
        elif observation_mode == "same":
            out["single_observation_space"] = dummy.observation_space
            out["observation_space"] = batch_space(dummy.observation_space, n)
        elif observation_mode == "different":
            env_spaces = [fn().observation_space for fn in env_fns]
            out["single_observation_space"] = env_spaces[0]
            out["observation_space"] = batch_differing_spaces(env_spaces)
        else:
            raise ValueError("Invalid `observation_mode`, expected: 'same' or 'different' or "
                             "tuple of single and batch observation space, actual got "
                             f"{observation_mode}")
    finally:
        dummy.close()
    return out


def check_shared_memory(shared_memory: bool, space: Space, ctx: Any) -> None:
    """gymnasium's rule: shared memory holds only the spaces it can batch."""
    if not shared_memory or rec.is_flat(space):
        return
    try:
        create_shared_memory(space, n=1, ctx=ctx)
    except CustomSpaceError as e:
        raise ValueError(
            "Using `AsyncVector(..., shared_memory=True)` caused an error, you can disable "
            "this feature with `shared_memory=False` however this is slower.") from e


def start(env: Any, ctx: multiprocessing.context.BaseContext, blocks: list[range],
          ranks: list[int] | None, max_concurrency: int | None, layout: rec.Layout,
          timeout: float) -> tuple[Any, Parent]:
    """Start the workers of ``env`` (a vector env, its spaces and options set): (its
    job, the parent's side of its messages)."""
    spaces = (env.single_observation_space, env.single_action_space)
    collective = env.batch_size == env.num_envs
    fns = list(env.env_fns)
    if ranks is None:
        from ._affinity import worker_cpus
        from ._job import Job

        semaphore = (ctx.BoundedSemaphore(max_concurrency)
                     if max_concurrency is not None else None)
        job = Job(ctx, blocks, fns, layout, env.autoreset_mode, semaphore, spaces,
                  collective, env.daemon, timeout, type(env).__name__,
                  worker_cpus(len(blocks)) if env.pin_workers else None)
        link, worker_ranks = job.link, job.ranks
        restart = job.restart if env.restart_failed else None
        group = link.new_group([0, *worker_ranks], timeout) if collective else None
        for r in worker_ranks if collective else ():
            link.send_object(group, r, tag=TAG_SETUP)
    else:
        from ._serve import Remote

        if max_concurrency is not None or env.restart_failed:
            raise ValueError("max_concurrency and restart_failed need the vector env's own "
                             "processes; they do not apply with ranks=")
        job = Remote(ranks, blocks, fns, layout, env.autoreset_mode, spaces, collective,
                     timeout)
        link, worker_ranks, restart, group = job.link, ranks, None, job.group
    return job, Parent(link, worker_ranks, blocks, layout, group, restart, job.death, timeout)
