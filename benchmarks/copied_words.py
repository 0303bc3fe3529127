"""Which words of the launcher's pages a forked rank changed, and what lies there.

A rank forked by ``minidist run`` shares the launcher's pages until it writes to one;
the write copies the whole page. :func:`report` finds the pages of the launcher's heap
(``[heap]`` and anonymous writable mappings that the launcher has too) that this process
holds a copy of (``/proc/self/pagemap``: present and mapped only here), takes a snapshot
of them, and compares each 8-byte word with the same address in the launcher
(``/proc/<launcher>/mem``: root, or a ptrace scope that lets a child read its parent).
Each changed word is named by the Python object that holds it, found by walking every
object the garbage collector knows and what they refer to, and by where in the object
it lies: the reference count, the type pointer, the garbage collector's header before
the object, or the rest of the object (a code object's rest is mostly its bytecode,
which CPython 3.11 rewrites as it specializes). Words outside every object found are
the allocator's own (a small-object pool's header), freed blocks, or memory that no
Python object is known to own (a dict's key table and a list's item array are named:
their pointers are read at CPython 3.11's offsets).

The launcher runs on while the rank does (it hosts the rendezvous), so a few of its own
pages changed too and show as changed here. Only CPython 3.11 on 64-bit Linux.
"""

from __future__ import annotations

import bisect
import collections
import ctypes
import gc
import os
import struct
import sys
import types

PAGE = os.sysconf("SC_PAGE_SIZE")
_DICT_KEYS_AT = 32  # PyDictObject.ma_keys (CPython 3.11, 64-bit)
_LIST_ITEMS_AT, _LIST_ALLOCATED_AT = 24, 32  # PyListObject.ob_item, .allocated
_GC_HEADER = 16  # PyGC_Head, just before a tracked object
_KEY_TABLE, _ITEM_ARRAY = "dict's key table", "list's item array"  # (not objects)


def _maps(pid: int | str) -> list[tuple[int, int, str, str]]:
    out = []
    with open(f"/proc/{pid}/maps") as f:
        for line in f:
            parts = line.split()
            lo, hi = (int(x, 16) for x in parts[0].split("-"))
            out.append((lo, hi, parts[1], parts[5] if len(parts) > 5 else "[anon]"))
    return out


def _pagemap(pid: int | str, lo: int, n: int) -> tuple[int, ...]:
    with open(f"/proc/{pid}/pagemap", "rb") as f:
        f.seek(lo // PAGE * 8)
        return struct.unpack(f"<{n}Q", f.read(n * 8))


def copied_pages(parent: int) -> tuple[list[int], int]:
    """Addresses of this process's own copies of the parent's heap pages, and how many
    more pages of the same mappings it uses that the parent never touched (fresh pages,
    the C heap's top, say: not copies)."""
    theirs = {lo: hi for lo, hi, _, _ in _maps(parent)}
    pages, fresh = [], 0
    for lo, hi, perms, name in _maps("self"):
        if theirs.get(lo) is None or "w" not in perms or name not in ("[heap]", "[anon]"):
            continue
        n = (min(hi, theirs[lo]) - lo) // PAGE  # (the C heap may have grown since)
        for i, (e, p) in enumerate(zip(_pagemap("self", lo, n), _pagemap(parent, lo, n))):
            if e >> 63 and (e >> 56) & 1:  # present, and mapped by this process only
                if p >> 63:
                    pages.append(lo + i * PAGE)
                else:
                    fresh += 1
    return pages, fresh


def _regions() -> list[tuple[int, int, str]]:
    """(address, size, what) of every object found, and of dicts' key tables and lists'
    item arrays."""
    seen: dict[int, object] = {}
    stack: list[object] = [*gc.get_objects(), *sys.modules.values()]
    while stack:
        o = stack.pop()
        if id(o) in seen:
            continue
        seen[id(o)] = o
        stack.extend(gc.get_referents(o))
        if type(o) is types.CodeType:
            stack.extend((o.co_consts, o.co_names, o.co_linetable, o.co_exceptiontable,
                          o.co_qualname, o.co_filename, o.co_varnames, o.co_freevars,
                          o.co_cellvars))
    out = []
    for addr, o in seen.items():
        t = type(o)  # (not isinstance: a weak proxy answers for its referent)
        try:
            size = type.__sizeof__(o) if issubclass(t, type) else sys.getsizeof(o)
        except Exception:
            size = t.__basicsize__
        out.append((addr, size, t.__name__))
        if t is dict:
            keys = ctypes.c_void_p.from_address(addr + _DICT_KEYS_AT).value
            if keys:
                out.append((keys, max(size - t.__basicsize__, 8), _KEY_TABLE))
        elif t is list:
            items = ctypes.c_void_p.from_address(addr + _LIST_ITEMS_AT).value
            allocated = ctypes.c_ssize_t.from_address(addr + _LIST_ALLOCATED_AT).value
            if items and allocated > 0:
                out.append((items, 8 * allocated, _ITEM_ARRAY))
    seen.clear()
    return sorted(out)


def report(parent: int, top: int = 16) -> None:
    """Print what the changed words of this process's copies of ``parent``'s pages are."""
    if sys.implementation.name != "cpython" or sys.version_info[:2] != (3, 11) \
            or sys.maxsize < 2**32:
        print("copied words: only CPython 3.11 on 64-bit Linux")
        return
    gc.disable()
    try:
        pages, fresh = copied_pages(parent)
        snapshot = [ctypes.string_at(p, PAGE) for p in pages]  # before the walk's increfs
        regions = _regions()
        starts = [r[0] for r in regions]
        words: collections.Counter = collections.Counter()
        holding: collections.Counter = collections.Counter()
        try:
            mem = open(f"/proc/{parent}/mem", "rb")  # noqa: SIM115 - closed below
        except OSError as e:
            print(f"copied words: cannot read the launcher's memory ({e})")
            return
        with mem:
            for page, mine in zip(pages, snapshot):
                mem.seek(page)
                theirs = mem.read(PAGE)
                kinds = set()
                for off in range(0, PAGE, 8):
                    if mine[off:off + 8] == theirs[off:off + 8]:
                        continue
                    kind = _name(page + off, regions, starts, off)
                    words[kind] += 1
                    kinds.add(kind)
                holding.update(kinds)
    finally:
        gc.enable()
    changed = sum(words.values())
    print(f"copied words: {len(pages)} of the launcher's heap pages are this rank's own "
          f"copies ({len(pages) * PAGE / 2**20:.2f} MiB); {changed} words of them differ "
          f"from the launcher's; {fresh} more pages of the same mappings "
          f"({fresh * PAGE / 2**20:.2f} MiB) were never in use in the launcher")
    print("    pages  words  where the changed words lie")
    for kind, n in holding.most_common(top):
        print(f"    {n:5d} {words[kind]:6d}  {kind}")


def _name(addr: int, regions: list, starts: list[int], page_offset: int) -> str:
    j = bisect.bisect_right(starts, addr) - 1
    if j >= 0:
        start, size, what = regions[j]
        if addr < start + size:
            at = addr - start
            if what in (_KEY_TABLE, _ITEM_ARRAY):
                return what
            field = {0: "reference count", 8: "type pointer"}.get(at, "the rest")
            return f"{what}: {field}"
    if j + 1 < len(regions) and 0 < regions[j + 1][0] - addr <= _GC_HEADER:
        return f"{regions[j + 1][2]}: garbage collector's header"
    if page_offset < 48:
        return "no object found (a small-object pool's header?)"
    return "no object found (freed, or memory no object is known to own)"
