"""The rendezvous key/value store: values are bytes, readers can wait for keys."""

from __future__ import annotations

import asyncio
from typing import Any


class KeyValueStore:
    """An in-memory store with blocking reads, like torch's TCPStore."""

    def __init__(self) -> None:
        self._data: dict[str, bytes] = {}
        self._changed = asyncio.Condition()

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

    async def serve(self, body: dict[str, Any], blob: bytes) -> tuple[dict[str, Any], bytes]:
        """Answer one request of the key/value protocol (``body["t"]`` is ``kv_set``,
        ``kv_get``, ``kv_wait``, ``kv_add``, ``kv_compare_set``, ``kv_check``,
        ``kv_delete`` or ``kv_num_keys``): (the reply's fields, the value it carries).
        The same code serves the rendezvous and a world of one. TimeoutError when a
        wait passes ``body["timeout"]``."""
        t = body["t"]
        timeout = float(body.get("timeout", 300.0))
        if t == "kv_set":
            await self.set(body["key"], blob)
            return {}, b""
        if t == "kv_get":
            return {}, await self.get(body["key"], timeout)
        if t == "kv_wait":
            await self.wait(body["keys"], timeout)
            return {}, b""
        if t == "kv_add":
            return {"value": await self.add(body["key"], body.get("amount", 1))}, b""
        if t == "kv_compare_set":
            return {}, await self.compare_set(body["key"], body["expected"].encode("latin-1"),
                                              blob)
        if t == "kv_check":
            return {"ok": self.check(body["keys"])}, b""
        if t == "kv_delete":
            return {"ok": self.delete(body["key"])}, b""
        if t == "kv_num_keys":
            return {"value": len(self)}, b""
        raise ValueError(f"unknown key/value request {t!r}")
