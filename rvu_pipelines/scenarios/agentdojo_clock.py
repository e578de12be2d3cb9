"""AgentDojo's simulated world on a fixed clock.

AgentDojo's tools stamp sent e-mails and created / appended files with the wall clock (`datetime.now()`), and the
stamp is part of the tool result the agent reads. So every prompt after such a call differed from run to run: the
LLM call cache missed, episodes were not reproducible, and the tool-use adapter's training traces (and their digest,
the zoo's reuse key) changed every second. Installing this clock makes those stamps one fixed moment.

The calendar also de-duplicated a new event's participants through a set, so their order in the tool result followed
the process's string-hash seed (``PYTHONHASHSEED``, random by default): the same call rendered differently in two
processes. :func:`install_ordered_participants` keeps them in first-seen order.
"""

from __future__ import annotations

import datetime
import functools
import sys
import types
from pathlib import Path
from typing import Any

# After every timestamp in the suites' data (latest: an e-mail of 2024-10-07), so the checks that compare a new stamp
# with the data's (AgentDojo's "file was appended: last_modified increased", "newest e-mail") read as with a wall clock.
AGENTDOJO_NOW = datetime.datetime(2025, 1, 1, 9, 0, 0)


class FixedDatetime(datetime.datetime):
    """`datetime.datetime` whose `now()` / `today()` / `utcnow()` are AGENTDOJO_NOW (in ``tz`` when one is given)."""

    @classmethod
    def now(cls, tz: datetime.tzinfo | None = None) -> datetime.datetime:  # type: ignore[override]
        return AGENTDOJO_NOW if tz is None else AGENTDOJO_NOW.replace(tzinfo=tz)

    @classmethod
    def today(cls) -> datetime.datetime:  # type: ignore[override]
        return AGENTDOJO_NOW

    @classmethod
    def utcnow(cls) -> datetime.datetime:  # type: ignore[override]
        return AGENTDOJO_NOW


class _ClockedDatetimeModule(types.ModuleType):
    """The `datetime` module as a tool module sees it: everything real except the `datetime` class."""

    datetime = FixedDatetime

    def __getattr__(self, name: str) -> Any:
        return getattr(datetime, name)


_CLOCKED = _ClockedDatetimeModule("datetime")


def install_fixed_clock() -> list[str]:
    """Point every loaded AgentDojo tool module's `datetime` at the fixed clock; returns the modules changed.

    Idempotent. Covers both import styles (`import datetime` and `from datetime import datetime`) so a newer
    agentdojo that stamps from another module is fixed too. Only `agentdojo.default_suites` modules (the simulated
    tools) whose source reads the clock are touched: the pydantic models that merely annotate with `datetime` keep
    the real class, and AgentDojo's own logging keeps real time."""
    changed = []
    for name, module in sorted(sys.modules.items()):
        if not name.startswith("agentdojo.default_suites") or module is None or not _reads_clock(module):
            continue
        current = getattr(module, "datetime", None)
        if current is datetime:
            module.datetime = _CLOCKED  # type: ignore[attr-defined]
        elif current is datetime.datetime:
            module.datetime = FixedDatetime  # type: ignore[attr-defined]
        else:
            continue
        changed.append(name)
    return changed


def _reads_clock(module: types.ModuleType) -> bool:
    path = getattr(module, "__file__", None)
    if not path or not path.endswith(".py"):
        return False
    try:
        source = Path(path).read_text(encoding="utf-8")
    except OSError:
        return False
    return any(call in source for call in (".now(", ".today(", ".utcnow("))


def install_ordered_participants() -> bool:
    """Wrap AgentDojo's ``Calendar.create_event`` so that the new event's participants come in first-seen order
    (the account's own address last, as AgentDojo appends it) instead of a set's. Idempotent; returns whether it
    wrapped the method now (False when already done, or when this agentdojo has no such calendar). The suites'
    checks compare participants as sets, since a set's order was never fixed."""
    try:
        from agentdojo.default_suites.v1.tools.calendar_client import Calendar
    except ImportError:
        return False
    original = Calendar.create_event
    if getattr(original, "ordered_participants", False):
        return False

    @functools.wraps(original)
    def create_event(self: Any, *args: Any, **kwargs: Any) -> Any:
        given = kwargs["participants"] if "participants" in kwargs else args[-1]
        order = list(dict.fromkeys([*given, self.account_email]))  # read before AgentDojo appends to the list
        event = original(self, *args, **kwargs)
        event.participants = order
        return event

    create_event.ordered_participants = True  # type: ignore[attr-defined]
    Calendar.create_event = create_event  # type: ignore[method-assign]
    return True
