"""``minidist.gymnasium.AsyncVectorEnv``: gymnasium's ``AsyncVectorEnv``, stepped through
minidist's shared-memory messages instead of a pipe per env."""

from __future__ import annotations

import multiprocessing
from collections.abc import Callable, Sequence
from copy import deepcopy
from typing import Any

import numpy as np
from gymnasium import Env, Space, logger
from gymnasium.error import (
    AlreadyPendingCallError,
    ClosedEnvironmentError,
    NoAsyncCallError,
)
from gymnasium.vector import AutoresetMode, VectorEnv
from gymnasium.vector.async_vector_env import AsyncState
from gymnasium.vector.async_vector_env import AsyncVectorEnv as GymnasiumAsyncVectorEnv
from gymnasium.vector.utils import (
    batch_space,
    create_empty_array,
    iterate,
)

from ..env import default_timeout
from . import _records as rec
from ._firstk import FirstK
from ._parent import Parent, Pending, Taken, WorkerLostError
from ._results import Results
from ._setup import check_max_concurrency, check_shared_memory, describe, start

__all__ = ["AsyncVectorEnv", "WorkerLostError"]


class AsyncVectorEnv(FirstK, VectorEnv):
    """Runs environments in parallel processes, like ``gymnasium.vector.AsyncVectorEnv``
    (the same constructor, methods, autoreset modes, errors and results), stepping them
    through minidist's shared memory instead of a pipe per env.

    Beyond gymnasium:

    * ``num_workers``: processes to run the envs in (default one per env); fewer runs
      several envs per process, stepped in turn (when envs outnumber cores).
    * ``batch_size``: with :meth:`async_reset`, :meth:`send` and :meth:`recv`, take the
      first ``batch_size`` envs that are ready (EnvPool's asynchronous stepping).
    * ``restart_failed``: a worker process that dies is started again; its envs' next
      results come from a ``reset`` and their info says ``"restarted": True``. Without
      it, a death raises :class:`WorkerLostError` naming the envs, within seconds.
    * ``ranks``: run the envs on these ranks of the running minidist job (which call
      :func:`minidist.gymnasium.serve`) instead of processes of its own.
    * ``timeout``: seconds any wait may last before it raises (default the job's timeout,
      ``MINIDIST_TIMEOUT`` or 300); workers wait for their next command without limit.
    * ``pin_workers``: run each of its own worker processes on one CPU of those the
      caller may use, round-robin (on from the vector envs made before in this
      process), one thread of every core first (default True; ``ranks=`` are left as
      they are).
    """

    def __new__(cls, env_fns: Sequence[Callable[[], Env]], *args: Any, **kwargs: Any) -> Any:
        """A custom ``worker=`` speaks gymnasium's pipe protocol: such a vector env is
        gymnasium's own ``AsyncVectorEnv`` (the same arguments but minidist's own)."""
        worker = kwargs.get("worker", args[4] if len(args) > 4 else None)
        if worker is None:
            return super().__new__(cls)
        mine = {"num_workers", "batch_size", "restart_failed", "ranks", "timeout",
                "pin_workers"}
        if mine & set(kwargs):
            raise ValueError(f"{sorted(mine & set(kwargs))} do not apply with a custom "
                             "`worker` (it runs on gymnasium's own AsyncVectorEnv)")
        return GymnasiumAsyncVectorEnv(env_fns, *args, **kwargs)

    def __init__(
        self,
        env_fns: Sequence[Callable[[], Env]],
        shared_memory: bool = True,
        copy: bool = True,
        context: str | None = None,
        daemon: bool = True,
        worker: Callable[..., None] | None = None,
        observation_mode: str | Space = "same",
        autoreset_mode: str | AutoresetMode = AutoresetMode.NEXT_STEP,
        max_concurrency: int | None = None,
        *,
        num_workers: int | None = None,
        batch_size: int | None = None,
        restart_failed: bool = False,
        ranks: Sequence[int] | None = None,
        timeout: float | None = None,
        pin_workers: bool = True,
    ) -> None:
        self.env_fns = env_fns
        self.shared_memory = shared_memory
        self.copy = copy
        self.context = context
        self.daemon = daemon
        self.worker = worker
        self.observation_mode = observation_mode
        self.autoreset_mode = (autoreset_mode if isinstance(autoreset_mode, AutoresetMode)
                               else AutoresetMode(autoreset_mode))
        check_max_concurrency(max_concurrency)
        self.max_concurrency = max_concurrency
        self.num_envs = len(env_fns)
        if ranks is not None:
            ranks = [int(r) for r in ranks]
            if num_workers is not None and num_workers != len(ranks):
                raise ValueError(f"num_workers={num_workers} but {len(ranks)} ranks given")
            num_workers = len(ranks)
        self.num_workers = self.num_envs if num_workers is None else int(num_workers)
        blocks = rec.blocks(self.num_envs, self.num_workers)
        self.batch_size = self.num_envs if batch_size is None else int(batch_size)
        if not 1 <= self.batch_size <= self.num_envs:
            raise ValueError(f"batch_size must be between 1 and the number of envs "
                             f"({self.num_envs}), not {batch_size}")
        self.restart_failed = bool(restart_failed)
        self.pin_workers = bool(pin_workers)
        self._state = AsyncState.DEFAULT
        self._parent: Parent | None = None

        for name, value in describe(env_fns, observation_mode, self.autoreset_mode).items():
            setattr(self, name, value)

        ctx = multiprocessing.get_context(context)
        check_shared_memory(self.shared_memory, self.single_observation_space, ctx)
        self.observations = create_empty_array(self.single_observation_space,
                                               n=self.num_envs, fn=np.zeros)
        self._layout = rec.layout(len(blocks[0]), self.single_action_space,
                                  self.single_observation_space)
        self._timeout = default_timeout_of(timeout)
        self._read = Results(self._layout, self.single_observation_space)
        self._failed = self._read.failed  # env -> the error that shut it down
        self._in_flight = np.zeros(self.num_envs, bool)  # sent, not yet received (first-k)
        self._stale: Pending | None = None  # a receive a timeout left running
        self._job, self._parent = start(self, ctx, blocks, ranks, max_concurrency,
                                        self._layout, self._timeout)
        self._workers = list(range(len(blocks)))
        self._lock_rows = self._parent.rows
        self._first_rows = np.zeros((self.batch_size, self._layout.reply_size), np.uint8)
        try:
            self._check_spaces()
        except BaseException:
            self.close(terminate=True)
            raise

    # ------------------------------------------------------------------ gymnasium's API

    @property
    def np_random_seed(self) -> tuple[int, ...]:
        """The np_random seed of every env."""
        return self.get_attr("np_random_seed")

    @property
    def np_random(self) -> tuple[np.random.Generator, ...]:
        """The numpy random number generator of every env."""
        return self.get_attr("np_random")

    def reset(self, *, seed: int | list[int | None] | None = None,
              options: dict[str, Any] | None = None) -> tuple[Any, dict[str, Any]]:
        """Reset every env (``seed``: one int, the seed of env 0 and counted up, or one
        per env); the batched observations and infos."""
        self.reset_async(seed=seed, options=options)
        return self.reset_wait()

    def reset_async(self, seed: int | list[int | None] | None = None,
                    options: dict[str, Any] | None = None) -> None:
        """Start resetting every env (or those of ``options["reset_mask"]``)."""
        self._assert_is_running()
        seeds = self._seeds(seed)
        self._idle("reset_async", end="")  # (gymnasium's message has no full stop here)
        self._nothing_in_flight("reset_async")
        masks = None
        if options is not None and "reset_mask" in options:
            options = dict(options)
            reset_mask = _reset_mask(options.pop("reset_mask"), self.num_envs)
            masks = np.zeros((self.num_workers, self._layout.slots), np.uint8)
            for w, b in enumerate(self._parent.blocks):
                masks[w, :len(b)] = reset_mask[b.start:b.stop]
        self._check_usable(np.flatnonzero(masks_envs(masks, self._parent)) if masks is not None
                           else None)
        self._parent.send(rec.RESET, self._workers,
                          [(seeds[b.start:b.stop], options) for b in self._parent.blocks],
                          masks=masks, all_answer=True)
        self._state = AsyncState.WAITING_RESET

    def reset_wait(self, timeout: float | None = None) -> tuple[Any, dict[str, Any]]:
        """The results of :meth:`reset_async`: batched observations and infos."""
        self._assert_is_running()
        if self._state != AsyncState.WAITING_RESET:
            raise NoAsyncCallError("Calling `reset_wait` without any prior call to "
                                   "`reset_async`.", AsyncState.WAITING_RESET.value)
        obs, _, _, _, infos = self._wait_results("reset_wait", timeout)
        return obs, infos

    def step(self, actions: Any) -> tuple[Any, np.ndarray, np.ndarray, np.ndarray, dict]:
        """Step every env with its action; batched observations, rewards, terminations,
        truncations and infos."""
        self.step_async(actions)
        return self.step_wait()

    def step_async(self, actions: Any) -> None:
        """Send every env its action (a batch of :attr:`action_space`)."""
        self._assert_is_running()
        self._begin("step_async")
        self._send_actions(actions, None)
        self._state = AsyncState.WAITING_STEP

    def step_wait(self, timeout: float | None = None) -> tuple[Any, np.ndarray, np.ndarray,
                                                              np.ndarray, dict]:
        """The results of :meth:`step_async`."""
        self._assert_is_running()
        if self._state != AsyncState.WAITING_STEP:
            raise NoAsyncCallError("Calling `step_wait` without any prior call to "
                                   "`step_async`.", AsyncState.WAITING_STEP.value)
        return self._wait_results("step_wait", timeout)

    def call(self, name: str, *args: Any, **kwargs: Any) -> tuple[Any, ...]:
        """Call method (or read attribute) ``name`` of every env; the results."""
        self.call_async(name, *args, **kwargs)
        return self.call_wait()

    def render(self) -> tuple[Any, ...] | None:
        """Every env's rendered frame."""
        return self.call("render")

    def call_async(self, name: str, /, *args: object, **kwargs: object) -> None:
        """Start calling ``name`` on every env."""
        self._assert_is_running()
        self._begin("call_async")
        self._parent.send(rec.CALL, self._workers,
                          [(name, args, kwargs)] * len(self._workers))
        self._state = AsyncState.WAITING_CALL

    def call_wait(self, timeout: float | None = None) -> tuple[Any, ...]:
        """The results of :meth:`call_async`, one per env."""
        self._assert_is_running()
        if self._state != AsyncState.WAITING_CALL:
            raise NoAsyncCallError("Calling `call_wait` without any prior call to "
                                   "`call_async`.", AsyncState.WAITING_CALL.value)
        results = self._read.objects(self._parent.in_env_order(
            self._take_all("call_wait", timeout)))
        self._state = AsyncState.DEFAULT
        return results

    def get_attr(self, name: str) -> tuple[Any, ...]:
        """Attribute ``name`` of every env."""
        return self.call(name)

    def set_attr(self, name: str, values: list[Any] | tuple[Any, ...] | object) -> None:
        """Set attribute ``name`` of every env (a list or tuple: one value per env)."""
        self._assert_is_running()
        if not isinstance(values, (list, tuple)):
            values = [values for _ in range(self.num_envs)]
        if len(values) != self.num_envs:
            raise ValueError(
                "Values must be a list or tuple with length equal to the number of "
                f"environments. Got `{len(values)}` values for {self.num_envs} environments.")
        self._begin("set_attr")
        self._parent.send(rec.SET_ATTR, self._workers,
                          [(name, list(values[b.start:b.stop])) for b in self._parent.blocks])
        self._read.objects(self._parent.in_env_order(self._take_all("set_attr", None)))

    def close_extras(self, timeout: float | None = None, terminate: bool = False) -> None:
        """Stop the envs and their processes (``terminate``: kill them at once; a
        pending call is first waited for up to ``timeout``)."""
        if self._parent is None:  # the constructor failed before the job started
            return
        timeout = 0 if terminate else timeout
        try:
            if self._state != AsyncState.DEFAULT:
                logger.warn(f"Calling `close` while waiting for a pending call to "
                            f"`{self._state.value}` to complete.")
                getattr(self, f"{self._state.value}_wait")(timeout)
        except multiprocessing.TimeoutError:
            terminate = True
        except Exception:  # an env's error or a lost worker: close all the same
            pass
        self._state = AsyncState.DEFAULT
        graceful = not terminate and self._parent.lost is None
        if graceful:
            try:
                self._finish_stale()
                self._in_flight[:] = False  # their answers come before the close's
                self._parent.send(rec.CLOSE, self._workers)
                self._parent.take(self._lock_rows, self.num_envs, split=False,
                                  timeout=self._timeout)
            except Exception:
                graceful = False
        if not graceful:
            self._job.kill()
        self._job.close(graceful)

    # ------------------------------------------------------------------ inside

    def _seeds(self, seed: int | list[int | None] | None) -> list[int | None]:
        if seed is None:
            return [None] * self.num_envs
        if isinstance(seed, int):
            return [seed + i for i in range(self.num_envs)]
        if len(seed) != self.num_envs:
            raise ValueError("If seeds are passed as a list the length must match "
                             f"num_envs={self.num_envs} but got length={len(seed)}.")
        return list(seed)

    def _idle(self, what: str, end: str = ".") -> None:
        """AlreadyPendingCallError (gymnasium's words) while a call waits for results."""
        if self._state != AsyncState.DEFAULT:
            raise AlreadyPendingCallError(
                f"Calling `{what}` while waiting for a pending call to "
                f"`{self._state.value}` to complete{end}", str(self._state.value))

    def _begin(self, what: str) -> None:
        """Check that a call to every env may start now (see :meth:`_idle`,
        :meth:`_nothing_in_flight`, :meth:`_check_usable`)."""
        self._idle(what)
        self._nothing_in_flight(what)
        self._check_usable(None)

    def _nothing_in_flight(self, what: str) -> None:
        if np.count_nonzero(self._in_flight):
            raise AlreadyPendingCallError(
                f"Calling `{what}` while env(s) {np.flatnonzero(self._in_flight).tolist()} "
                "are still stepping: `recv` them first", "step")

    def _check_usable(self, env_ids: np.ndarray | None) -> None:
        """Raise if an env addressed (None: any) was shut down by an error or its
        process was lost; first wait for the answers a timeout left behind."""
        self._finish_stale()
        if self._parent.lost is not None:
            raise RuntimeError(f"the vector env lost a worker earlier ({self._parent.lost}); "
                               "close it")
        if not self._failed:
            return
        failed = sorted(self._failed) if env_ids is None else \
            [int(i) for i in env_ids if int(i) in self._failed]
        if failed:
            i = failed[0]
            raise RuntimeError(f"env {i} was shut down after it raised {self._failed[i]} (as "
                               "gymnasium's AsyncVectorEnv does); close this vector env")

    def _send_actions(self, actions: Any, env_ids: np.ndarray | None) -> None:
        p = self._parent
        n = self.num_envs if env_ids is None else len(env_ids)
        split = env_ids is not None and p.group is None
        workers, masks = (p.addressing(env_ids) if split else (self._workers, None))
        batches = rec.flat_actions(self._layout, self.single_action_space, actions, n)
        if batches is not None:
            p.put_actions(batches, env_ids=env_ids)
            p.send(rec.STEP, workers, masks=masks, split=split)
            return
        space = self.action_space if env_ids is None else batch_space(
            self.single_action_space, n)
        acts = list(iterate(space, actions))
        if len(acts) != n:
            raise ValueError(f"{n} actions expected, {len(acts)} given")
        per_env: dict[int, Any] = dict(zip(
            range(self.num_envs) if env_ids is None else env_ids.tolist(), acts, strict=True))
        payloads = [[per_env.get(i) for i in p.blocks[w]] for w in workers]
        p.send(rec.STEP, workers, payloads, masks=masks, split=split)

    def _take(self, rows: np.ndarray, want: int, split: bool, timeout: float | None,
              what: str) -> Taken:
        try:
            taken = self._parent.take(rows, want, split, timeout)
            self._state = AsyncState.DEFAULT  # the call is over, whatever it returned
            return taken
        except Pending as e:
            self._stale = e
            self._state = AsyncState.DEFAULT
            raise multiprocessing.TimeoutError(
                f"The call to `{what}` has timed out after {timeout} second(s).") from None
        except BaseException:
            self._state = AsyncState.DEFAULT
            raise

    def _take_all(self, what: str, timeout: float | None) -> Taken:
        self._finish_stale()
        return self._take(self._lock_rows, self.num_envs, False, timeout, what)

    def _finish_stale(self) -> None:
        if self._stale is not None:
            stale, self._stale = self._stale, None
            self._parent.finish(stale)

    def _wait_results(self, what: str, timeout: float | None) -> tuple:
        self._finish_stale()
        taken = self._parent.in_env_order(
            self._take(self._lock_rows, self.num_envs, False, timeout, what))
        self._state = AsyncState.DEFAULT
        obs, rewards, terms, truncs, infos = self._read.steps(taken, self.observations)
        self.observations = obs
        if self.copy:
            obs = obs.copy() if type(obs) is np.ndarray else deepcopy(obs)
        return obs, rewards, terms, truncs, infos

    def _check_spaces(self) -> None:
        self._parent.send(rec.CHECK, self._workers,
                          [(self.observation_mode, self.single_observation_space,
                            self.single_action_space)] * len(self._workers))
        results = self._read.objects(self._parent.in_env_order(
            self._take_all("check_spaces", None)))
        same_obs, same_act = zip(*results, strict=True)
        if not all(same_obs):
            if self.observation_mode == "same":
                raise RuntimeError(
                    "AsyncVectorEnv(..., observation_mode='same') however some of the "
                    "sub-environments observation spaces are not equivalent. If this is "
                    "intentional, use `observation_mode='different'` instead.")
            raise RuntimeError(
                "AsyncVectorEnv(..., observation_mode='different' or custom space) however "
                "the sub-environment's observation spaces do not share a common shape and "
                "dtype.")
        if not all(same_act):
            raise RuntimeError(
                f"Some environments have an action space different from "
                f"`{self.single_action_space}`. In order to batch actions, the action spaces "
                "from all environments must be equal.")

    def _assert_is_running(self) -> None:
        if self.closed:
            raise ClosedEnvironmentError(
                f"Trying to operate on `{type(self).__name__}`, after a call to `close()`.")

    def __del__(self) -> None:
        if not getattr(self, "closed", True) and getattr(self, "_parent", None) is not None:
            self.close(terminate=True)


def default_timeout_of(timeout: float | None) -> float:
    import os

    return default_timeout(os.environ) if timeout is None else float(timeout)


def masks_envs(masks: np.ndarray, parent: Parent) -> np.ndarray:
    """Per env: whether ``masks`` (workers, slots) addresses it."""
    return masks[parent.worker_of, parent.slot_of] > 0


def _reset_mask(reset_mask: Any, num_envs: int) -> np.ndarray:
    if not isinstance(reset_mask, np.ndarray):
        raise TypeError(f"`options['reset_mask']` must be a numpy array, got {type(reset_mask)}")
    if reset_mask.shape != (num_envs,):
        raise ValueError(f"`options['reset_mask']` must have shape `({num_envs},)`, got "
                         f"{reset_mask.shape}")
    if reset_mask.dtype != np.bool_:
        raise TypeError(f"`options['reset_mask']` must have `dtype=np.bool_`, got "
                        f"{reset_mask.dtype}")
    if not np.any(reset_mask):
        raise ValueError("`options['reset_mask']` must contain a boolean array with at least "
                         f"one True value, got reset_mask={reset_mask}")
    return reset_mask
