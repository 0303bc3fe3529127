"""EnvPool's asynchronous stepping for :class:`minidist.gymnasium.AsyncVectorEnv`:
``async_reset``, ``send`` and ``recv`` (the first ``batch_size`` envs that are ready)."""

from __future__ import annotations

from typing import Any

import numpy as np
from gymnasium.error import AlreadyPendingCallError, NoAsyncCallError
from gymnasium.vector.utils import create_empty_array

from . import _records as rec


class FirstK:
    """The first-k methods of the vector env (a part of its class)."""

    def async_reset(self, seed: int | list[int | None] | None = None,
                    options: dict[str, Any] | None = None) -> None:
        """Start resetting every env; :meth:`recv` takes the first ``batch_size``."""
        self._assert_is_running()
        seeds = self._seeds(seed)
        self._begin("async_reset")
        self._parent.send(rec.RESET, self._workers,
                          [(seeds[b.start:b.stop], options) for b in self._parent.blocks],
                          split=self._parent.group is None)
        self._in_flight[:] = True

    def send(self, actions: Any, env_ids: Any = None) -> None:
        """Send the envs ``env_ids`` (default: every env) their actions (``actions[i]``
        for ``env_ids[i]``); they step while the caller goes on."""
        self._assert_is_running()
        self._idle("send")
        ids = np.arange(self.num_envs) if env_ids is None else np.asarray(env_ids)
        if not _distinct_envs(ids, self.num_envs):
            raise ValueError(f"env_ids must be distinct env indices 0..{self.num_envs - 1}, "
                             f"not {env_ids!r}")
        if self._parent.group is not None and len(ids) != self.num_envs:
            raise ValueError(f"with batch_size == num_envs ({self.num_envs}), send every env "
                             f"its action at once, not {len(ids)}")
        busy = ids[self._in_flight[ids]]
        if len(busy):
            raise AlreadyPendingCallError(
                f"Calling `send` for env(s) {busy.tolist()} still stepping: `recv` them "
                "first", "step")
        self._check_usable(ids)
        self._send_actions(actions, ids)
        self._in_flight[ids] = True

    def recv(self, timeout: float | None = None) -> tuple[Any, np.ndarray, np.ndarray,
                                                          np.ndarray, dict]:
        """The first ``batch_size`` envs to finish their step (or reset): batched
        observations, rewards, terminations, truncations and infos, in the order they
        came; ``infos["env_id"]`` says which env each row is."""
        self._assert_is_running()
        self._idle("recv")
        k = self.batch_size
        flying = int(np.count_nonzero(self._in_flight))
        if flying < k:
            raise NoAsyncCallError(
                f"Calling `recv` with {flying} env(s) stepping, fewer than batch_size={k}: "
                "`send` actions (or `async_reset`) first", "step")
        self._finish_stale()
        if self._parent.group is not None:  # k is every env: one gather
            taken = self._parent.in_env_order(
                self._take(self._lock_rows, k, False, timeout, "recv"))
        else:
            taken = self._take(self._first_rows, k, True, timeout, "recv")
        ids = taken.records[:, 0:4].view(np.int32)[:, 0].copy()
        self._in_flight[ids] = False
        obs = create_empty_array(self.single_observation_space, n=k, fn=np.zeros)
        obs, rewards, terms, truncs, infos = self._read.steps(taken, obs)
        infos["env_id"] = ids
        return obs, rewards, terms, truncs, infos



def _distinct_envs(ids: np.ndarray, num_envs: int) -> bool:
    """Whether ``ids`` is a 1-d array of distinct integers in 0..num_envs - 1."""
    if ids.ndim != 1 or ids.dtype.kind not in "iu":
        return False
    if not len(ids):
        return True
    if ids.min() < 0 or ids.max() >= num_envs:
        return False
    seen = np.zeros(num_envs, bool)
    seen[ids] = True
    return int(np.count_nonzero(seen)) == len(ids)
