"""Reading the records of a vector env's replies: batched observations, rewards, flags
and infos, call results, and the errors of envs that raised (logged and raised as
gymnasium's ``AsyncVectorEnv`` does)."""

from __future__ import annotations

import pickle
from typing import Any

import numpy as np
from gymnasium import Space, logger
from gymnasium.vector import VectorEnv
from gymnasium.vector.utils import concatenate

from . import _records as rec
from ._parent import Taken


class _Infos:
    """Batches the infos of ``num_envs`` results (gymnasium's rule, for any count)."""

    _add_info = VectorEnv._add_info

    def __init__(self, num_envs: int) -> None:
        self.num_envs = num_envs


class _Columns:
    """Views of the fields of a block of records (one record per row)."""

    def __init__(self, recs: np.ndarray, layout: rec.Layout, obs_space: Space) -> None:
        self.status, self.terminated, self.truncated = recs[:, 4], recs[:, 5], recs[:, 6]
        self.rewards = recs[:, 8:16].view(np.float64)[:, 0]
        self.lengths = recs[:, 16:20].view(np.int32)[:, 0]
        leaves = layout.obs_leaves or []
        self.obs = [rec.batch_view(recs, leaf, rec.RECORD_HEAD) for leaf in leaves]
        self.single = len(leaves) == 1 and type(obs_space) in rec.FLAT


class Results:
    """Reads records of ``layout`` for envs of ``obs_space``. ``failed`` collects the
    envs that raised (env id -> the error in words)."""

    def __init__(self, layout: rec.Layout, obs_space: Space) -> None:
        self.layout, self.obs_space = layout, obs_space
        self.failed: dict[int, str] = {}
        self._kept: tuple = (None,)  # (records, their columns): _columns

    def payload(self, taken: Taken, i: int) -> Any:
        """The unpickled payload of record ``i`` (inline or big)."""
        data = taken.payloads.get(i)
        if data is None:
            n = int(taken.records[i, 16:20].view(np.int32)[0])
            off = self.layout.record_payload_offset
            data = taken.records[i, off:off + n].tobytes()
        return pickle.loads(data)

    def steps(self, taken: Taken, obs_out: Any) -> tuple:
        """Observations (written into ``obs_out``, a batch of the records' count),
        rewards, terminations, truncations and infos of the records, in their order."""
        recs = taken.records
        cols = self._columns(recs)
        if np.count_nonzero(cols.status):
            self.raise_errors(taken)
        k = len(recs)
        lengths = cols.lengths
        infos: dict[str, Any] = {}
        obs_list: list[Any] | None = None if self.layout.obs_leaves else [None] * k
        if np.count_nonzero(lengths):
            batch = _Infos(k)
            flags = recs[:, 7]
            for i in np.flatnonzero(lengths).tolist():
                got = self.payload(taken, i)
                if flags[i] & rec.F_OBS:
                    obs_list[i], got = got
                if got:
                    infos = batch._add_info(infos, got, i)
        if obs_list is None:
            outs = [obs_out] if cols.single else rec.values(self.obs_space, obs_out)
            for view, out in zip(cols.obs, outs, strict=True):
                out[...] = view
        else:
            obs_out = concatenate(self.obs_space, obs_list, obs_out)
        return (obs_out, cols.rewards.copy(), cols.terminated.astype(np.bool_),
                cols.truncated.astype(np.bool_), infos)

    def _columns(self, recs: np.ndarray) -> _Columns:
        """The fields of records ``recs`` as arrays (made once for the same records)."""
        kept = self._kept
        if kept[0] is not recs:
            kept = self._kept = (recs, _Columns(recs, self.layout, self.obs_space))
        return kept[1]

    def objects(self, ordered: Taken) -> tuple[Any, ...]:
        """Each record's payload (None where it has none), records in env order."""
        self.raise_errors(ordered)
        lengths = ordered.records[:, 16:20].view(np.int32)[:, 0]
        return tuple(self.payload(ordered, i) if lengths[i] else None
                     for i in range(len(lengths)))

    def raise_errors(self, taken: Taken) -> None:
        """gymnasium's report of envs that raised: each logged, the last raised."""
        recs = taken.records
        if not recs[:, 4].any():
            return
        errors = np.flatnonzero(recs[:, 4] == rec.ERROR).tolist()
        last = None
        for n, i in enumerate(errors):
            env_id = int(recs[i, 0:4].view(np.int32)[0])
            etype, value, trace = self.payload(taken, i)
            self.failed.setdefault(env_id, f"{etype.__name__}: {value}")
            logger.error(f"Received the following error from Worker-{env_id} - Shutting it "
                         "down")
            logger.error(f"{trace}")
            if n == len(errors) - 1:
                logger.error("Raising the last exception back to the main process.")
                last = value
        raise last
