"""Shared fixtures for the memory-monitor tests: a small S_0 with SOUL.md and two sessions."""

from __future__ import annotations

import pytest

from rvu_pipelines.memory import Channel, InMemoryStore, MemoryItem, ReferenceMonitor
from rvu_pipelines.memory.attacks import soul_item

SHARED = "shared"


@pytest.fixture
def monitor() -> ReferenceMonitor:
    m = ReferenceMonitor(InMemoryStore())
    m.install_many(
        [
            soul_item(SHARED),
            MemoryItem(SHARED, "MEMORY.md", "# memory\n", Channel.SYSTEM),
            MemoryItem("alice", "notes.md", "alice's notes", Channel.USER),
            MemoryItem("alice", "cache/page.html", "<html>cached web page</html>", Channel.WEB, tainted=True),
            MemoryItem("bob", "secret", "bob-token", Channel.USER),
        ]
    )
    return m
