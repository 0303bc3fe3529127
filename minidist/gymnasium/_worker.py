"""A worker process's side of a vector env: it builds its envs, then answers the parent's
commands (see :mod:`minidist.gymnasium._records`) until the parent closes it or leaves."""

from __future__ import annotations

import dataclasses
import pickle
import sys
import traceback
from collections.abc import Callable
from typing import Any

import numpy as np
from gymnasium.spaces.utils import is_space_dtype_shape_equiv
from gymnasium.vector import AutoresetMode

from ..errors import DistTimeoutError, PeerLostError
from ..group import Group
from . import _records as rec
from ._link import TAG_SETUP, Link

_NO_INFO = b""
FOREVER = 10 * 365 * 86400.0  # how long a worker waits for its parent's next command


class Slot:
    """One env of this worker and what its next step must know."""

    def __init__(self, env_id: int, env: Any, restarted: bool) -> None:
        self.env_id = env_id
        self.env = env
        self.autoreset = False  # AutoresetMode.NEXT_STEP: the next step resets
        self.last_obs: Any = None  # for a reset that leaves this env as it is
        self.failed = False  # raised once: shut down, as gymnasium does
        self.error: tuple[int, Any] | None = None  # its error, still to be reported
        self.restarted = restarted  # rebuilt after its process died: report a reset


class Worker:
    """Runs ``envs`` (env id -> env) for the parent rank ``parent`` over ``link``."""

    def __init__(self, link: Link, parent: int, env_ids: list[int],
                 env_fns: list[Callable[[], Any]], layout: rec.Layout,
                 autoreset_mode: AutoresetMode, spaces: tuple[Any, Any],
                 group: Group | None, semaphore: Any = None, restarted: bool = False) -> None:
        self.link, self.parent, self.layout = link, parent, layout
        self.group = None if group is None else _patient(group)
        self.last_seq = -1
        self.saved: list[tuple[np.ndarray, list[bytes]]] = []  # the replies to last_seq
        self.autoreset_mode = autoreset_mode
        self.obs_space, self.action_space = spaces
        self.semaphore = semaphore
        self.slots = []
        for i, fn in zip(env_ids, env_fns, strict=True):
            try:
                s = Slot(i, fn(), restarted)
            except Exception as e:  # every command to it answers with this error
                s = Slot(i, None, restarted)
                s.failed, s.error = True, self._error(e)
            self.slots.append(s)
        self.command = np.zeros(layout.command_size, np.uint8)
        self.reply = np.zeros(layout.reply_size, np.uint8)
        self._big: list[bytes] = []  # payloads to send after the current row
        r = layout.record_size
        self._obs_views = [[rec.leaf_view(self.reply, leaf, k * r + rec.RECORD_HEAD)
                            for leaf in layout.obs_leaves or ()] for k in range(layout.slots)]
        self._act_views = [[rec.leaf_view(self.command, leaf,
                                          layout.actions_offset + k * layout.action_bytes)
                            for leaf in layout.action_leaves or ()]
                           for k in range(layout.slots)]
        self.seq = 0
        self._record_size = layout.record_size
        flat1 = layout.obs_leaves is not None and type(self.obs_space) in rec.FLAT
        self._obs_single = [v[0] for v in self._obs_views] if flat1 else None
        scalar = (layout.action_leaves is not None and type(self.action_space) in rec.FLAT
                  and layout.action_leaves[0].shape == ())
        self._act_scalar = [v[0] for v in self._act_views] if scalar else None
        self._mask = self.command[layout.mask_offset:layout.mask_offset + layout.slots]
        # a step's envs run in one loop (:meth:`_steps`): scalar actions, one flat
        # observation, no semaphore, every slot of the row an env of this worker
        self._plain = (self._act_scalar is not None and self._obs_single is not None
                       and semaphore is None and len(self.slots) == layout.slots)
        self._record = rec.RECORD.pack_into

    # ------------------------------------------------------------------ the loop

    def run(self, parent_may_vanish: bool = True) -> None:
        """Answer commands until CLOSE, or until the parent is gone (PeerLostError unless
        ``parent_may_vanish``). When another worker of the collective channel dies, wait
        for the parent's new group and go on."""
        try:
            while True:
                try:
                    op, payload, flags, mask = self._next()
                    if op == rec.STEP and self._plain and payload is None and \
                            self._steps(flags):
                        continue
                    if op == rec.CLOSE:
                        self._close(mask, flags)
                        return
                    self._dispatch(op, payload, flags, mask)
                except PeerLostError as e:
                    if self.group is None or self.parent in e.ranks or not e.ranks:
                        raise
                    self.group = _patient(self._wait(rec_object=True))
        except PeerLostError as e:
            if parent_may_vanish and (self.parent in e.ranks or not e.ranks):
                return  # the parent left or died: nobody to answer
            raise

    def _close(self, mask: np.ndarray, flags: int) -> None:
        for s in self.slots:
            if s.env is not None and not s.failed:
                s.env.close()
            s.failed, s.error = False, None
        self._answer(mask, flags, lambda s, k: (rec.OK, None))

    def _wait(self, rec_object: bool = False) -> Any:
        """The next command row (or, with ``rec_object``, the parent's next group), as
        long as it takes."""
        while True:
            try:
                if rec_object:
                    return self.link.recv_object(self.parent, TAG_SETUP)
                if self.group is not None:
                    self.link.scatter(self.command, None, self.parent, self.group)
                else:
                    self.link.recv(self.command, self.parent)
                return None
            except DistTimeoutError:
                continue  # the parent may think for as long as it likes

    def _next(self) -> tuple[int, Any, int, np.ndarray]:
        """The next new command: (op, its payload, flags, the slots it addresses). A
        command already answered (sent again after another worker's restart) is
        answered again with the same replies."""
        while True:
            self._wait()
            op, n, flags, seq = rec.COMMAND.unpack_from(self.command, 0)
            if seq != self.last_seq:
                break
            for row, big in self.saved:
                self._post(row, big)
        self.seq = self.last_seq = seq
        self.saved = []
        mask = self._mask
        if flags & rec.BIG:
            payload = pickle.loads(self.link.recv_object(self.parent))
        elif n:
            off = self.layout.command_payload_offset
            payload = pickle.loads(self.command[off:off + n])
        else:
            payload = None
        return op, payload, flags, mask

    def _dispatch(self, op: int, payload: Any, flags: int, mask: np.ndarray) -> None:
        if op == rec.STEP:
            self._answer(mask, flags, self._step, payload)
        elif op == rec.RESET:
            seeds, options = payload
            self._answer(mask, flags, self._reset, seeds, options, all_slots=True)
        elif op == rec.CALL:
            self._answer(mask, flags, self._call, payload)
        elif op == rec.SET_ATTR:
            self._answer(mask, flags, self._set_attr, payload)
        elif op == rec.CHECK:
            self._answer(mask, flags, self._check, payload)
        else:
            raise RuntimeError(f"unknown command {op} from the vector env")

    def _answer(self, mask: np.ndarray, flags: int, run: Callable[..., Any], *args: Any,
                all_slots: bool = False) -> None:
        """Run ``run(slot, k, *args)`` for each addressed slot ``k`` (every slot with
        ``all_slots``: ``run`` reads the mask itself) and reply: one row, or with SPLIT
        a row per env as each is done."""
        split = flags & rec.SPLIT
        mask_list = mask.tolist()
        if not split:
            self._clear()
        for k, s in enumerate(self.slots):
            if not (mask_list[k] or all_slots):
                continue
            if split:
                self._clear()
            if s.failed:
                got = s.error or self._error(RuntimeError(
                    f"env {s.env_id} was shut down after an error"))
                s.error = None
            else:
                try:
                    got = run(s, k, *args) if run is not None else (rec.OK, None)
                except (KeyboardInterrupt, Exception) as e:
                    got = self._error(e)
                    s.failed = True
                    try:
                        s.env.close()
                    except Exception:  # closing a broken env: its error was the news
                        pass
            self._write(0 if split else k, s, got)
            if split:
                self._send()
        if not split:
            self._send()

    def _steps(self, flags: int) -> bool:
        """A step of every env of the row in one loop (what :meth:`_answer` with
        :meth:`_step` does, for the layout of ``_plain``): True when done and sent;
        False, with nothing done, when the general path must answer (not every slot
        addressed, a slot failed or restarted, a split row of several envs)."""
        slots = self.slots
        if flags & rec.SPLIT and len(slots) > 1:
            return False
        mask = self._mask
        for k, s in enumerate(slots):
            if not mask[k] or s.failed or s.restarted:
                return False
        reply, size, seq, put = self.reply, self._record_size, self.seq, self._record
        acts, single = self._act_scalar, self._obs_single
        mode = self.autoreset_mode
        next_step, same_step = mode == AutoresetMode.NEXT_STEP, mode == AutoresetMode.SAME_STEP
        for k, s in enumerate(slots):
            try:
                if next_step and s.autoreset:
                    obs, info = s.env.reset()
                    reward, term, trunc = 0.0, False, False
                else:
                    obs, reward, term, trunc, info = s.env.step(acts[k][()])
                    if same_step and (term or trunc):
                        reset_obs, reset_info = s.env.reset()
                        info = {"final_info": info, "final_obs": obs, **reset_info}
                        obs = reset_obs
                if next_step:
                    s.autoreset = bool(term or trunc)
                s.last_obs = obs
            except (KeyboardInterrupt, Exception) as e:  # as _answer reports it
                s.failed = True
                got = self._error(e)
                try:
                    s.env.close()
                except Exception:
                    pass
                self._write(k, s, got)
                continue
            if obs is not None:
                single[k][...] = obs
            n = f = 0
            if info:
                data = pickle.dumps(info, protocol=5)
                n, f = len(data), self._payload(k, data)
            put(reply, k * size, s.env_id, rec.OK, term, trunc, f, reward, n, seq)
        self._send()
        return True

    def _clear(self) -> None:
        r = self.layout.record_size
        for k in range(self.layout.slots):
            rec.RECORD.pack_into(self.reply, k * r, rec.NO_ENV, 0, 0, 0, 0, 0.0, 0, self.seq)

    def _send(self) -> None:
        big, self._big = self._big, []
        self.saved.append((self.reply.copy(), big))
        self._post(self.reply, big)

    def _post(self, row: np.ndarray, big: list[bytes]) -> None:
        if self.group is not None:
            self.link.gather(row, None, self.parent, self.group)
        else:
            self.link.send(row, self.parent)
        for payload in big:
            self.link.send_object(payload, self.parent)

    @staticmethod
    def _error(e: BaseException) -> tuple[int, Any]:
        trace = traceback.format_exc()
        etype, value = type(e), e
        try:
            pickle.dumps((etype, value))
        except Exception:  # an exception that does not pickle: its text still travels
            etype, value = RuntimeError, RuntimeError(f"{type(e).__name__}: {e}")
        return rec.ERROR, (etype, value, trace)

    def _write(self, k: int, s: Slot, got: tuple) -> None:
        """Record ``k`` of the reply: ``got`` is (status, payload) or, for an observation,
        (status, obs, reward, terminated, truncated, info, restarted)."""
        flags = 0
        if len(got) == 2:
            status, reward, term, trunc = got[0], 0.0, False, False
            payload = _NO_INFO if got[1] is None else pickle.dumps(got[1], protocol=5)
        else:
            status, obs, reward, term, trunc, info, restarted = got
            if restarted:
                flags = rec.F_RESTARTED
            single = self._obs_single
            if single is not None:
                if obs is not None:  # None: a reset left as it is, before any reset
                    single[k][...] = obs
                payload = pickle.dumps(info, protocol=5) if info else _NO_INFO
            elif self.layout.obs_leaves is None:
                flags |= rec.F_OBS
                payload = pickle.dumps((obs, info), protocol=5)
            else:
                if obs is not None:
                    for view, value in zip(self._obs_views[k], rec.values(self.obs_space, obs),
                                           strict=True):
                        view[...] = value
                payload = pickle.dumps(info, protocol=5) if info else _NO_INFO
        rec.RECORD.pack_into(self.reply, k * self._record_size, s.env_id, status, term,
                             trunc, flags | self._payload(k, payload), reward, len(payload),
                             self.seq)

    def _payload(self, k: int, data: bytes) -> int:
        """Put ``data`` in record ``k``'s payload, or, too big for it, after the row
        (:data:`rec.F_BIG`, the record's flag to say so; else 0)."""
        n = len(data)
        if n > rec.REPLY_PAYLOAD:
            self._big.append(data)
            return rec.F_BIG
        if n:
            off = k * self._record_size + self.layout.record_payload_offset
            self.reply[off:off + n] = np.frombuffer(data, np.uint8)
        return 0

    # ------------------------------------------------------------------ the commands

    def _action(self, k: int, actions: Any) -> Any:
        if actions is not None:  # pickled: one per addressed slot, in slot order
            return actions[k]
        if self._act_scalar is not None:
            return self._act_scalar[k][()]
        views = self._act_views[k]
        if len(views) == 1 and type(self.action_space) in rec.FLAT:
            return views[0].copy()
        return _rebuild(self.action_space, iter(views))

    def _held(self, run: Callable[..., Any], *args: Any) -> Any:
        if self.semaphore is None:
            return run(*args)
        with self.semaphore:
            return run(*args)

    def _step(self, s: Slot, k: int, actions: Any) -> tuple:
        if s.restarted:  # its first answer after a restart: a reset's
            obs, info = self._held(s.env.reset)
            s.restarted, s.autoreset, s.last_obs = False, False, obs
            return rec.OK, obs, 0.0, False, False, {**info, "restarted": True}, True
        action = self._action(k, actions)
        mode = self.autoreset_mode
        if mode == AutoresetMode.NEXT_STEP and s.autoreset:
            obs, info = self._held(s.env.reset)
            reward, term, trunc = 0.0, False, False
        elif self.semaphore is None:
            obs, reward, term, trunc, info = s.env.step(action)
        else:
            obs, reward, term, trunc, info = self._held(s.env.step, action)
        if mode == AutoresetMode.SAME_STEP and (term or trunc):
            reset_obs, reset_info = self._held(s.env.reset)
            info = {"final_info": info, "final_obs": obs, **reset_info}
            obs = reset_obs
        if mode == AutoresetMode.NEXT_STEP:
            s.autoreset = bool(term or trunc)
        s.last_obs = obs
        return rec.OK, obs, reward, term, trunc, info, False

    def _reset(self, s: Slot, k: int, seeds: list[Any], options: Any) -> tuple:
        if not self.command[self.layout.mask_offset + k]:  # left as it is
            return rec.OK, s.last_obs, 0.0, False, False, {}, False
        obs, info = self._held(lambda: s.env.reset(seed=seeds[k], options=options))
        restarted = s.restarted
        if restarted:
            info = {**info, "restarted": True}
        s.restarted, s.autoreset, s.last_obs = False, False, obs
        return rec.OK, obs, 0.0, False, False, info, restarted

    def _call(self, s: Slot, k: int, payload: tuple) -> tuple:
        name, args, kwargs = payload
        if name in ("reset", "step", "close", "_setattr", "_check_spaces"):
            raise ValueError(f"Trying to call function `{name}` with `call`, use `{name}` "
                             "directly instead.")
        attr = s.env.get_wrapper_attr(name)
        return rec.OK, attr(*args, **kwargs) if callable(attr) else attr

    def _set_attr(self, s: Slot, k: int, payload: tuple) -> tuple:
        name, values = payload
        s.env.set_wrapper_attr(name, values[k])
        return rec.OK, None

    def _check(self, s: Slot, k: int, payload: tuple) -> tuple:
        mode, obs_space, action_space = payload
        same_obs = (obs_space == s.env.observation_space if mode == "same"
                    else is_space_dtype_shape_equiv(obs_space, s.env.observation_space))
        return rec.OK, (bool(same_obs), bool(action_space == s.env.action_space))


def _patient(group: Group) -> Group:
    """``group`` as a worker waits on it: as long as its parent lives."""
    return dataclasses.replace(group, timeout=FOREVER)


def _rebuild(space: Any, views: Any) -> Any:
    """A value of flat ``space`` from its leaves' views (copied), in leaf order."""
    if type(space) is rec.spaces.Tuple:
        return tuple(_rebuild(s, views) for s in space.spaces)
    if type(space) is rec.spaces.Dict:
        return {key: _rebuild(s, views) for key, s in space.spaces.items()}
    v = next(views)
    return v[()] if v.ndim == 0 else v.copy()


def report(where: str) -> None:
    """Print the exception being handled, naming the worker (for errors outside an env)."""
    print(f"minidist.gymnasium worker {where}: {traceback.format_exc()}", file=sys.stderr,
          flush=True)
