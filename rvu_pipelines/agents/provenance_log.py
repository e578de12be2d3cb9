"""An agent episode as incident-log records (configs/schemas/incident_log.schema.json).

Every step becomes one provenance entry: the user query (root), each assistant message, each tool
call it made (also the ones the tool boundary blocked), each tool result and each defense notice, with
parent edges along the conversation (a call's parent is its assistant message, a result's parent is
its call, the next assistant message's parent is the last thing it read). Timestamps are a logical
clock (1, 2, 3, ...), not wall time, so the same episode always gives the same bytes and so the same
certificate. Tool results the detector flags carry ``contaminated: true``: the recovery seeds.

An episode a defense stopped before generation (``trace.abort``: the ``hfer`` kill switch) ends in a
``defense_abort`` record instead of the closing assistant message AgentDojo appends (the model never
wrote it): its content is JSON (defense, the tool output's entry id and message index, detector version,
layer, statistic, score, threshold, the abort message) and its parent is the tool output that fired, which
is marked contaminated, so recovery starts from it.
"""

from __future__ import annotations

import hashlib
import json
import re
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any, Protocol

from agentdojo.types import ChatMessage, get_text_content_as_str

from rvu_pipelines.provenance.incident import write_incident as _write_jsonl
from rvu_pipelines.scenarios.contract import Scenario, prefill_calls


class LifecycleLine(Protocol):
    """An adapter load or unload: its incident-log fields, placed before the episode's model call ``calls_before``."""

    @property
    def calls_before(self) -> int: ...

    @property
    def fields(self) -> Mapping[str, Any]: ...


class AdapterSchedule(Protocol):
    """What the log needs of an episode run under adapters (``adapters.runtime.EpisodeAdapters`` is one):
    the adapter active at each model call (None: the base model) and the lifecycle lines between calls.
    A protocol, so the agents never import the adapter package that builds on them."""

    @property
    def call_adapters(self) -> Sequence[str | None]: ...

    @property
    def events(self) -> Sequence[LifecycleLine]: ...


_ID_CHARS = re.compile(r"[^A-Za-z0-9._:@/+-]")
MAX_EPISODE_ID = 100  # entry ids append "/e000" and must stay within the schema's 128 characters


def episode_id(scenario_id: str, defense: str) -> str:
    """A schema-valid, stable identifier for (defense, scenario)."""
    raw = _ID_CHARS.sub("-", f"{defense}:{scenario_id}")
    if not raw[0].isalnum():
        raw = "e" + raw
    if len(raw) > MAX_EPISODE_ID:
        digest = hashlib.sha256(raw.encode()).hexdigest()[:16]
        raw = f"{raw[: MAX_EPISODE_ID - 17]}+{digest}"
    return raw


def _text(message: Mapping[str, Any]) -> str:
    content = message.get("content")
    return get_text_content_as_str(content) if content else ""  # type: ignore[arg-type]


def _call_text(function: str, args: Mapping[str, Any]) -> str:
    return json.dumps({"tool": function, "arguments": dict(args)}, sort_keys=True, default=str)


def episode_records(
    scenario: Scenario,
    defense: str,
    messages: Sequence[ChatMessage],
    *,
    detector: Any = None,
    threshold: float = 0.5,
    trace: Any = None,
    adapters: AdapterSchedule | None = None,
) -> list[dict[str, Any]]:
    """The episode's steps as incident-log action records, in conversation order.

    ``trace`` (an ``EpisodeTrace``) supplies blocked calls and the original text of tool outputs a
    defense rewrote; ``detector`` (any ``InjectionDetector``) flags contaminated tool outputs, scored
    on the text the tool really returned. ``adapters`` (``adapters.runtime.EpisodeAdapters``, the
    episode's share of an ``AdapterTimeline``) adds the adapter loads and unloads as lifecycle lines
    where they happened (roots: an adapter is not derived from the conversation) and sets
    ``active_adapter_id`` on what the model wrote under one (its message, its calls, blocked or not);
    tool outputs and user turns come from outside the model and carry none.
    """
    episode = episode_id(scenario.scenario_id, defense)
    blocked: dict[int, list[Any]] = {}
    originals: Mapping[int, str] = {}
    if trace is not None:
        for call in trace.blocked:
            blocked.setdefault(call.message_index, []).append(call)
        originals = trace.original_outputs

    # tool outputs, as the tools returned them, scored in one batch
    tool_texts = {
        i: originals.get(i, _text(m) if not m.get("error") else f"error: {m['error']}")
        for i, m in enumerate(messages)
        if m["role"] == "tool"
    }
    flagged: set[int] = set()
    scored = [i for i, text in tool_texts.items() if text.strip()]
    if detector is not None and scored:
        scores = detector.score([tool_texts[i] for i in scored])
        flagged = {i for i, score in zip(scored, [float(s) for s in scores], strict=True) if score >= threshold}
    abort = getattr(trace, "abort", None) if trace is not None else None
    if abort is not None and abort.message_index in tool_texts:
        flagged.add(abort.message_index)  # the switch judged it contaminated: a recovery seed

    records: list[dict[str, Any]] = []
    last_id: str | None = None  # the newest entry of the conversation (parent of the next message)
    call_entry: dict[str, str] = {}  # tool_call_id -> entry id of the call
    tool_entry: dict[int, str] = {}  # tool message index -> entry id of its output
    abort_recorded = False

    def add_abort(stop: Any) -> str:
        fired = tool_entry.get(stop.message_index)
        content = json.dumps({**stop.as_record(), "tool_output_entry": fired}, sort_keys=True)
        return add("defense_abort", content, fired if fired is not None else last_id)

    prefilled = bool(prefill_calls(scenario))  # the protocol's first turn (InjecAgent, BIPIA): not the model's
    model_calls = _model_call_count(messages, abort) - int(
        prefilled and any(m["role"] == "assistant" for m in messages)
    )
    call_adapters = list(adapters.call_adapters) if adapters is not None else [None] * model_calls
    if len(call_adapters) != model_calls:
        raise ValueError(
            f"episode {episode}: the adapter timeline saw {len(call_adapters)} model calls but the episode has "
            f"{model_calls} model messages; wrap the agent's chat model in one AdapterTimeline per run."
        )
    pending = sorted(adapters.events if adapters is not None else (), key=lambda e: e.calls_before)
    first_assistant = next((i for i, m in enumerate(messages) if m["role"] == "assistant"), -1)
    calls_done = 0

    def add(
        action_type: str, content: str, parent: str | None, contaminated: bool = False, by_model: bool = False
    ) -> str:
        entry = f"{episode}/e{len(records):03d}"
        records.append(
            {
                "kind": "action",
                "entry_id": entry,
                "episode_id": episode,
                "action_type": action_type,
                "content": content,
                "parent_id": parent,
                "timestamp": float(len(records) + 1),
                "active_adapter_id": call_adapters[calls_done - 1] if by_model else None,
                "contaminated": contaminated,
            }
        )
        return entry

    def add_lifecycle(upto: int) -> None:
        """The loads / unloads placed before model call ``upto`` (relative to the episode)."""
        while pending and pending[0].calls_before <= upto:
            event = pending.pop(0)
            entry = f"{episode}/e{len(records):03d}"
            records.append(
                {**event.fields, "entry_id": entry, "episode_id": episode, "timestamp": float(len(records) + 1)}
            )

    for index, message in enumerate(messages):
        role = message["role"]
        if role == "system":
            continue  # the system prompt is configuration, not an episode step
        if role == "user":
            action = "user_input" if last_id is None else "defense_notice"
            last_id = add(action, _text(message), last_id)
        elif role == "assistant":
            closing = index == len(messages) - 1
            if abort is not None and closing and not abort_recorded and _text(message) == abort.reason:
                # AgentDojo's closing message on an abort: the defense's words, not the model's
                last_id, abort_recorded = add_abort(abort), True
                continue
            by_model = not (prefilled and index == first_assistant)
            if by_model:
                add_lifecycle(calls_done)
                calls_done += 1
            assistant = add("assistant_output", _text(message), last_id, by_model=by_model)
            last_id = assistant
            for call in message.get("tool_calls") or []:
                entry = add("tool_call", _call_text(call.function, call.args), assistant, by_model=by_model)
                call_entry[str(call.id)] = entry
            for call in blocked.get(index, []):
                blocked_text = _call_text(call.function, call.args) + f" blocked: {call.reason}"
                add("tool_call_blocked", blocked_text, assistant, by_model=by_model)
        elif role == "tool":
            call = message.get("tool_call")
            parent = call_entry.get(
                str(
                    message.get("tool_call_id")
                    if message.get("tool_call_id") is not None
                    else getattr(call, "id", None)
                ),
                last_id,
            )
            last_id = add("tool_output", tool_texts[index], parent, contaminated=index in flagged)
            tool_entry[index] = last_id
    if abort is not None and not abort_recorded:  # the messages lack AgentDojo's closing message: still recorded
        add_abort(abort)
    add_lifecycle(model_calls)  # what happened after the last model call (an unload at the end)
    return records


def _model_call_count(messages: Sequence[ChatMessage], abort: Any) -> int:
    """Assistant messages the model wrote: all of them but AgentDojo's closing message of an aborted episode."""
    count = sum(1 for m in messages if m["role"] == "assistant")
    if abort is not None and messages and messages[-1]["role"] == "assistant" and _text(messages[-1]) == abort.reason:
        count -= 1
    return count


def contaminated_count(records: Sequence[Mapping[str, Any]]) -> int:
    return sum(1 for record in records if record.get("contaminated"))


def write_incident(path: Path | str, records: Sequence[Mapping[str, Any]]) -> Path:
    """Write the records as a JSONL incident log (sorted keys, one line each)."""
    return _write_jsonl(records, path)
