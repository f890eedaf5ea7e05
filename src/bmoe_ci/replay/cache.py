"""The expert cache as docs/streaming.md states it: an LRU over (layer, expert) with a byte budget,
each resident expert charged one slot of its own layer (layers whose experts differ in type have slots
of different sizes); pinned entries are never evicted; a demand insert may go over budget when every
entry is pinned, a speculative one never does."""

from __future__ import annotations

from collections import OrderedDict
from dataclasses import dataclass, field

Key = tuple[int, int]  # (streamed layer index, expert)


@dataclass
class CacheEntry:
    pins: int = 0
    prefetched: bool = False  # read speculatively and not used yet


@dataclass
class LruCache:
    budget: int
    slot_bytes: dict[int, int]  # streamed layer index -> what one resident expert of it costs
    entries: OrderedDict[Key, CacheEntry] = field(default_factory=OrderedDict)  # least recent first
    evictions: int = 0
    over_budget_loads: int = 0  # demand loads that found every entry pinned and went over budget
    bytes: int = 0  # the resident entries' costs

    def __contains__(self, key: Key) -> bool:
        return key in self.entries

    def touch(self, key: Key) -> None:
        self.entries.move_to_end(key)

    def _victim(self) -> Key | None:
        return next((k for k, e in self.entries.items() if e.pins == 0), None)

    def _evict(self, key: Key) -> None:
        del self.entries[key]  # a prefetched entry evicted before use is simply lost
        self.bytes -= self.slot_bytes[key[0]]
        self.evictions += 1

    def insert(self, key: Key, *, speculative: bool = False) -> bool:
        """Insert as most recent, evicting least recent unpinned entries until it fits. A
        speculative insert happens only if it fits without going over budget; returns whether the
        entry was inserted."""
        cost = self.slot_bytes[key[0]]
        if speculative and self.bytes + cost > self.budget:
            evictable = sum(self.slot_bytes[k[0]] for k, e in self.entries.items() if e.pins == 0)
            if cost > self.budget or self.bytes - evictable + cost > self.budget:
                return False
        while self.entries and self.bytes + cost > self.budget:
            victim = self._victim()
            if victim is None:
                self.over_budget_loads += 1  # everything is pinned: over budget until the pins drop
                break
            self._evict(victim)
        self.entries[key] = CacheEntry(prefetched=speculative)
        self.bytes += cost
        return True

    def pin(self, key: Key) -> None:
        self.entries[key].pins += 1

    def unpin(self, key: Key) -> None:
        e = self.entries.get(key)
        if e is not None and e.pins > 0:
            e.pins -= 1

    def trim(self) -> None:
        """Back to budget after the pins of a layer are dropped."""
        while self.bytes > self.budget:
            victim = self._victim()
            if victim is None:
                return
            self._evict(victim)
