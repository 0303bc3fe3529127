"""The rendezvous key/value store: values are bytes, readers can wait for keys."""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable, Mapping
from typing import Any

from .. import messages


class KeyValueStore:
    """An in-memory store with blocking reads, like torch's TCPStore."""

    def __init__(self) -> None:
        self._data: dict[str, bytes] = {}
        self._changed = asyncio.Condition()
        # what answers each request
        self._answers: dict[type[messages.Message],
                            Callable[[Any], Awaitable[messages.Reply]]] = {
            messages.KvSet: self._set, messages.KvGet: self._get,
            messages.KvWait: self._wait, messages.KvAdd: self._add,
            messages.KvCompareSet: self._compare_set, messages.KvCheck: self._check,
            messages.KvDelete: self._delete, messages.KvNumKeys: self._num_keys}

    async def set(self, key: str, value: bytes) -> None:
        async with self._changed:
            self._data[key] = bytes(value)
            self._changed.notify_all()

    async def add(self, key: str, amount: int) -> int:
        """Add to an integer counter (created at 0); return the new value."""
        async with self._changed:
            value = int(self._data.get(key, b"0")) + int(amount)
            self._data[key] = str(value).encode()
            self._changed.notify_all()
            return value

    async def compare_set(self, key: str, expected: bytes, desired: bytes) -> bytes:
        """Set ``key`` to ``desired`` if it holds ``expected`` (or is absent and ``expected``
        is empty); return the value it holds afterwards."""
        async with self._changed:
            current = self._data.get(key)
            if (current is None and not expected) or current == expected:
                self._data[key] = bytes(desired)
                self._changed.notify_all()
            return self._data[key] if key in self._data else b""

    async def wait(self, keys: list[str], timeout: float) -> None:
        """Return once every key exists; TimeoutError after ``timeout`` seconds."""
        async with asyncio.timeout(timeout), self._changed:
            await self._changed.wait_for(lambda: all(k in self._data for k in keys))

    async def get(self, key: str, timeout: float) -> bytes:
        await self.wait([key], timeout)
        return self._data[key]

    def check(self, keys: list[str]) -> bool:
        return all(k in self._data for k in keys)

    def delete(self, key: str) -> bool:
        return self._data.pop(key, None) is not None

    def __len__(self) -> int:
        return len(self._data)

    async def serve(self, request: messages.Message | Mapping[str, Any],
                    blob: bytes = b"") -> tuple[dict[str, Any], bytes]:
        """Answer one request of the key/value protocol (a message of
        :data:`~minidist.messages.KV_REQUESTS`, or the JSON object and blob of one):
        (the reply's fields, the value it carries). The same code serves the rendezvous
        and a world of one. TimeoutError when a wait passes the request's ``timeout``;
        ValueError for a message that is no key/value request."""
        msg = request if isinstance(request, messages.Message) else \
            messages.parse(request, blob)
        reply = await self.answer(msg)
        return reply.body, reply.data

    async def answer(self, msg: messages.Message) -> messages.Reply:
        """The reply to one key/value request (see :meth:`serve`)."""
        handler = self._answers.get(type(msg))
        if handler is None:
            raise ValueError(f"unknown key/value request {msg.type!r}")
        return await handler(msg)

    async def reply(self, msg: messages.Message) -> messages.Reply:
        """As :meth:`answer`, but a wait that passes its deadline is answered too: an
        error naming the keys still missing."""
        try:
            return await self.answer(msg)
        except TimeoutError:
            keys = msg.keys if isinstance(msg, messages.KvWait) else [msg.key]
            missing = [k for k in keys if not self.check([k])]
            return messages.Reply(id=msg.id, timeout=True, error=(
                f"store keys not set within {_timeout(msg):g} s: {missing}"))

    async def _set(self, m: messages.KvSet) -> messages.Reply:
        await self.set(m.key, m.value)
        return messages.Reply(id=m.id)

    async def _get(self, m: messages.KvGet) -> messages.Reply:
        return messages.Reply(id=m.id, data=await self.get(m.key, _timeout(m)))

    async def _wait(self, m: messages.KvWait) -> messages.Reply:
        await self.wait(m.keys, _timeout(m))
        return messages.Reply(id=m.id)

    async def _add(self, m: messages.KvAdd) -> messages.Reply:
        return messages.Reply(id=m.id, value=await self.add(m.key, m.amount))

    async def _compare_set(self, m: messages.KvCompareSet) -> messages.Reply:
        return messages.Reply(id=m.id, data=await self.compare_set(
            m.key, m.expected.encode("latin-1"), m.desired))

    async def _check(self, m: messages.KvCheck) -> messages.Reply:
        return messages.Reply(id=m.id, ok=self.check(m.keys))

    async def _delete(self, m: messages.KvDelete) -> messages.Reply:
        return messages.Reply(id=m.id, ok=self.delete(m.key))

    async def _num_keys(self, m: messages.KvNumKeys) -> messages.Reply:
        return messages.Reply(id=m.id, value=len(self))


def _timeout(m: Any) -> float:
    """A request's deadline in seconds (300 when it names none)."""
    return 300.0 if m.timeout is None else float(m.timeout)
