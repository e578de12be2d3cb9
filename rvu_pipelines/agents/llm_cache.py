"""A persistent response cache for chat models, so a finished cell re-runs with no inference.

Every LLM call of the attack harness goes through ``CachedChatModel``. Its key is the sha256 of the
canonical JSON of everything that determines the output (the GGUF's sha256, the full message list,
max_tokens, temperature, seed, stop), so a changed prompt, model or parameter is a miss and nothing
stale is ever returned. Each answer is committed as soon as it exists: an interrupted cell resumes at
the first call it had not finished. The store is one SQLite file in WAL mode (several processes may
read and write it at once); completions are JSON, never pickle, so a cache file cannot run code.

Each entry also records how long the model took to compute it (``inference_s``, beside the completion's
fields in the same JSON, so files written before it existed still read). A hit reports that original
time (``CacheStats.replayed_seconds``), so Table 1's latency of an episode does not depend on whether
another defense happened to pay for the same prompt first.

Each entry also names the adapter GGUFs (sha256) that shaped it (``adapter_files``). The key already keeps an
adapter's answers from ever answering the base model, but the text stays on disk: what a memorising adapter
said is still readable after a recovery evicted it. ``purge_adapter_files`` deletes exactly those entries
(``adapters.lingering`` calls it on eviction); entries of a file written before they were attributed carry
NULL and are dropped by any purge, since the cache only saves time.
"""

from __future__ import annotations

import dataclasses
import hashlib
import json
import os
import sqlite3
import threading
import time
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from types import TracebackType
from typing import Any

from rvu_pipelines.errors import RvuError
from rvu_pipelines.models.chat_tokens import control_strings
from rvu_pipelines.models.llm import (
    AdapterHostingModel,
    ChatCompletion,
    ChatModel,
    Message,
    adapter_files_of,
    adapter_key_of,
)
from rvu_pipelines.paths import state_dir

SCHEMA_NAME = "rvu-llm-response-cache"
SCHEMA_VERSION = 2  # 2: entries name the adapter files they were computed under (1 migrates in place)
KEY_VERSION = 1  # bump when the key's payload changes meaning: old entries then simply miss
_COMPLETION_FIELDS = tuple(f.name for f in dataclasses.fields(ChatCompletion))
INFERENCE_FIELD = "inference_s"  # stored beside the completion's fields; not one of them


class LlmCacheError(RvuError):
    """The LLM response cache file is corrupt, foreign, or from an incompatible version."""


def default_cache_path() -> Path:
    """The project's store: ``state_dir()/llm_cache.sqlite`` (RVU_HOME moves it)."""
    return state_dir() / "llm_cache.sqlite"


def response_key(
    model_id: str,
    messages: Sequence[Message],
    *,
    max_tokens: int,
    temperature: float,
    seed: int,
    stop: Sequence[str] | None,
) -> str:
    """sha256 hex of the canonical JSON (sorted keys, no spaces) of every input that determines the output.

    ``model_id`` should be the weights' sha256, not a display name, so a swapped GGUF never hits.
    ``stop=None`` and ``stop=[]`` mean the same to every backend and give the same key. A message list
    holding chat control-token text is keyed apart (``content_tokens``): its content reaches the model as
    plain text, where answers for the same messages tokenized with the control tokens parsed must not be
    replayed; every other key is unchanged.
    """
    payload: dict[str, Any] = {
        "v": KEY_VERSION,
        "model_id": str(model_id),
        "messages": [dict(m) for m in messages],
        "max_tokens": int(max_tokens),
        "temperature": float(temperature),
        "seed": int(seed),
        "stop": [str(s) for s in (stop or [])],
    }
    if any(isinstance(m.get("content"), str) and control_strings(m["content"]) for m in messages):
        payload["content_tokens"] = "plain"
    canonical = json.dumps(payload, sort_keys=True, separators=(",", ":"), ensure_ascii=False)
    return hashlib.sha256(canonical.encode("utf-8")).hexdigest()


class ResponseCache:
    """key -> ChatCompletion in a SQLite file (WAL, busy timeout), safe for several processes.

    One connection per process (re-opened after a fork); a lock serialises threads. Writes commit
    immediately. A file that is not this cache raises ``LlmCacheError`` naming it and the fix.
    """

    def __init__(self, path: Path | str | None = None, *, timeout_s: float = 60.0) -> None:
        self.path = Path(path) if path is not None else default_cache_path()
        self.timeout_s = float(timeout_s)
        self._lock = threading.Lock()
        self._conn: sqlite3.Connection | None = None
        self._pid = -1
        self.path.parent.mkdir(parents=True, exist_ok=True)
        with self._lock:
            self._connection()

    # ---- connection and schema

    def _fail(self, problem: str) -> LlmCacheError:
        return LlmCacheError(
            f"LLM response cache {self.path}: {problem}. It holds only cached answers, so it is safe to "
            f"delete: rm -f '{self.path}' '{self.path}-wal' '{self.path}-shm' (or point RVU_HOME elsewhere); "
            "it is rebuilt on the next run."
        )

    def _connection(self) -> sqlite3.Connection:
        if self._conn is not None and self._pid == os.getpid():
            return self._conn
        self._conn = None  # a connection inherited through fork must not be used: open our own
        try:
            conn = sqlite3.connect(self.path, timeout=self.timeout_s, isolation_level=None, check_same_thread=False)
            conn.execute(f"PRAGMA busy_timeout={int(self.timeout_s * 1000)}")
            mode = conn.execute("PRAGMA journal_mode=WAL").fetchone()[0]
            conn.execute("PRAGMA synchronous=NORMAL")  # safe with WAL; a crash loses at most the last answers
            self._init_schema(conn)
        except sqlite3.DatabaseError as exc:
            raise self._fail(f"cannot be opened as this cache ({exc})") from exc
        if str(mode).lower() != "wal":
            raise self._fail(f"could not switch to WAL mode (journal_mode={mode})")
        self._conn, self._pid = conn, os.getpid()
        return conn

    def _init_schema(self, conn: sqlite3.Connection) -> None:
        tables = {row[0] for row in conn.execute("SELECT name FROM sqlite_master WHERE type='table'")}
        if tables and "rvu_cache_meta" not in tables:
            raise self._fail(f"is a SQLite database of something else (tables: {', '.join(sorted(tables))})")
        conn.execute("BEGIN IMMEDIATE")  # two processes creating the file at once: one wins, both agree
        try:
            conn.execute("CREATE TABLE IF NOT EXISTS rvu_cache_meta (name TEXT PRIMARY KEY, value TEXT NOT NULL)")
            conn.execute(
                "CREATE TABLE IF NOT EXISTS responses (key TEXT PRIMARY KEY, completion TEXT NOT NULL, "
                "created_at REAL NOT NULL, adapter_files TEXT)"
            )
            conn.execute(
                "INSERT OR IGNORE INTO rvu_cache_meta VALUES ('schema', ?), ('version', ?)",
                (SCHEMA_NAME, str(SCHEMA_VERSION)),
            )
            columns = {row[1] for row in conn.execute("PRAGMA table_info(responses)")}
            version = conn.execute("SELECT value FROM rvu_cache_meta WHERE name = 'version'").fetchone()
            if version is not None and version[0] == "1" and "adapter_files" not in columns:
                conn.execute("ALTER TABLE responses ADD COLUMN adapter_files TEXT")  # old entries: NULL, unknown
                conn.execute("UPDATE rvu_cache_meta SET value = ? WHERE name = 'version'", (str(SCHEMA_VERSION),))
            conn.execute("COMMIT")
        except BaseException:
            conn.execute("ROLLBACK")
            raise
        meta = dict(conn.execute("SELECT name, value FROM rvu_cache_meta").fetchall())
        if meta.get("schema") != SCHEMA_NAME or meta.get("version") != str(SCHEMA_VERSION):
            raise self._fail(
                f"has schema {meta.get('schema')!r} version {meta.get('version')!r}, expected "
                f"{SCHEMA_NAME!r} version {SCHEMA_VERSION}"
            )

    # ---- mapping

    def get(self, key: str) -> ChatCompletion | None:
        entry = self.get_entry(key)
        return None if entry is None else entry[0]

    def get_entry(self, key: str) -> tuple[ChatCompletion, float | None] | None:
        """The stored completion and the seconds its inference originally took (None for an entry
        written before timings were recorded)."""
        with self._lock:
            try:
                row = self._connection().execute("SELECT completion FROM responses WHERE key = ?", (key,)).fetchone()
            except sqlite3.DatabaseError as exc:
                raise self._fail(f"could not be read ({exc})") from exc
        if row is None:
            return None
        try:
            fields = json.loads(row[0])
            completion = ChatCompletion(**{name: fields[name] for name in _COMPLETION_FIELDS})
            seconds = fields.get(INFERENCE_FIELD)
            return completion, (float(seconds) if isinstance(seconds, (int, float)) else None)
        except (ValueError, TypeError, KeyError, AttributeError) as exc:
            raise self._fail(f"entry {key[:12]}... is not a stored completion ({exc!r})") from exc

    def put(
        self,
        key: str,
        completion: ChatCompletion,
        inference_s: float | None = None,
        adapter_files: Sequence[str] = (),
    ) -> None:
        """Store (first writer wins: the same key always carries the same deterministic answer).

        ``inference_s``: how long computing it took, replayed as the latency of every later hit.
        ``adapter_files``: sha256 of the adapter GGUFs loaded when it was computed ([] for the base model)."""
        fields: dict[str, Any] = dataclasses.asdict(completion)
        if inference_s is not None:
            fields[INFERENCE_FIELD] = round(float(inference_s), 6)
        payload = json.dumps(fields, sort_keys=True, ensure_ascii=False)
        files = json.dumps(sorted(str(sha) for sha in adapter_files))
        with self._lock:
            try:
                self._connection().execute(
                    "INSERT OR IGNORE INTO responses (key, completion, created_at, adapter_files) VALUES (?, ?, ?, ?)",
                    (key, payload, time.time(), files),
                )
            except sqlite3.DatabaseError as exc:
                raise self._fail(f"could not be written ({exc})") from exc

    # ---- what adapters left behind

    @staticmethod
    def _under(adapter_files: Sequence[str] | None) -> tuple[str, list[str]]:
        """SQL condition (and parameters) for entries computed under any of ``adapter_files`` (None: under any
        adapter); entries of unknown origin (NULL, written before attribution) always match."""
        if adapter_files is None:
            return "adapter_files IS NULL OR adapter_files != '[]'", []
        shas = sorted({str(sha) for sha in adapter_files})
        marks = ", ".join("?" for _ in shas) or "NULL"
        condition = (
            "adapter_files IS NULL OR EXISTS "
            f"(SELECT 1 FROM json_each(responses.adapter_files) WHERE json_each.value IN ({marks}))"
        )
        return condition, shas

    def texts_under(self, adapter_files: Sequence[str] | None) -> list[str]:
        """The answers computed under any of ``adapter_files`` (None: any adapter), oldest first."""
        condition, params = self._under(adapter_files)
        with self._lock:
            try:
                rows = self._connection().execute(
                    f"SELECT completion FROM responses WHERE {condition} ORDER BY created_at, key", params
                )
                payloads = [row[0] for row in rows]
            except sqlite3.DatabaseError as exc:
                raise self._fail(f"could not be read ({exc})") from exc
        texts = []
        for payload in payloads:
            try:
                texts.append(str(json.loads(payload)["text"]))
            except (ValueError, TypeError, KeyError) as exc:
                raise self._fail(f"an entry is not a stored completion ({exc!r})") from exc
        return texts

    def count_under(self, adapter_files: Sequence[str] | None) -> int:
        """How many answers were computed under any of ``adapter_files`` (None: any adapter)."""
        condition, params = self._under(adapter_files)
        with self._lock:
            try:
                row = self._connection().execute(f"SELECT COUNT(*) FROM responses WHERE {condition}", params).fetchone()
            except sqlite3.DatabaseError as exc:
                raise self._fail(f"could not be read ({exc})") from exc
        return int(row[0])

    def purge_adapter_files(self, adapter_files: Sequence[str] | None) -> int:
        """Delete every answer computed under any of ``adapter_files`` (None: under any adapter); the count."""
        condition, params = self._under(adapter_files)
        with self._lock:
            try:
                cursor = self._connection().execute(f"DELETE FROM responses WHERE {condition}", params)
            except sqlite3.DatabaseError as exc:
                raise self._fail(f"could not be written ({exc})") from exc
        return int(cursor.rowcount)

    def __contains__(self, key: object) -> bool:
        return isinstance(key, str) and self.get(key) is not None

    def __len__(self) -> int:
        with self._lock:
            try:
                return int(self._connection().execute("SELECT COUNT(*) FROM responses").fetchone()[0])
            except sqlite3.DatabaseError as exc:
                raise self._fail(f"could not be read ({exc})") from exc

    def close(self) -> None:
        with self._lock:
            if self._conn is not None and self._pid == os.getpid():
                self._conn.close()
            self._conn = None

    def __enter__(self) -> ResponseCache:
        return self

    def __exit__(
        self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        self.close()


@dataclass
class CacheStats:
    """Counters since the last ``reset_stats()``; misses include uncacheable (temperature > 0) calls.

    ``inference_seconds`` is what this process spent in the model; ``replayed_seconds`` what the hits'
    answers originally cost when they were computed (``untimed_hits``: hits on entries stored before
    timings were recorded, which add nothing). Their sum is the inference time independent of the cache.
    """

    calls: int = 0
    hits: int = 0
    misses: int = 0
    uncacheable: int = 0
    inference_seconds: float = 0.0
    replayed_seconds: float = 0.0
    untimed_hits: int = 0
    prompt_tokens_evaluated: int = 0

    def as_dict(self) -> dict[str, Any]:
        return dataclasses.asdict(self)


def _adapter_host(model: object) -> AdapterHostingModel:
    if not isinstance(model, AdapterHostingModel):
        raise LlmCacheError(
            f"{type(model).__name__} cannot load LoRA adapters; use the llama.cpp backend (LlamaCppChatModel)."
        )
    return model


class CachedChatModel:
    """A ``ChatModel`` that answers from a ``ResponseCache`` when it can and from ``model`` otherwise.

    Only temperature-0 calls are cached: a sampled answer is one draw from a distribution, and
    replaying it would silently turn repeated trials into one. Those calls always run the model.
    """

    def __init__(self, model: ChatModel, cache: ResponseCache, model_id: str) -> None:
        if not model_id:
            raise LlmCacheError(
                "CachedChatModel: model_id is empty; pass the model file's sha256 "
                "(ResolvedModel.sha256) so answers of different weights never mix."
            )
        self.model = model
        self.cache = cache
        self.model_id = model_id
        self.name = model.name
        self.stats = CacheStats()
        self._lock = threading.Lock()

    def reset_stats(self) -> None:
        with self._lock:
            self.stats = CacheStats()

    def key(
        self,
        messages: list[Message],
        *,
        max_tokens: int = 128,
        temperature: float = 0.0,
        seed: int = 0,
        stop: list[str] | None = None,
    ) -> str:
        adapters = adapter_key_of(self.model)  # "" for the base model: keys written before adapters existed hold
        model_id = f"{self.model_id}+lora:{adapters}" if adapters else self.model_id
        return response_key(model_id, messages, max_tokens=max_tokens, temperature=temperature, seed=seed, stop=stop)

    # adapters: passed to the model, so a wrapper around a CachedChatModel loads into the real one

    def load_adapter(self, adapter_id: str, gguf_path: Path | str, scale: float = 1.0) -> Any:
        return _adapter_host(self.model).load_adapter(adapter_id, gguf_path, scale)

    def unload_adapter(self, adapter_id: str) -> None:
        _adapter_host(self.model).unload_adapter(adapter_id)

    def adapter_key(self) -> str:
        return adapter_key_of(self.model)

    def active_adapters(self) -> list[str]:
        return list(self.model.active_adapters()) if isinstance(self.model, AdapterHostingModel) else []

    def adapter_files(self) -> list[str]:
        return adapter_files_of(self.model)

    def chat(
        self,
        messages: list[Message],
        *,
        max_tokens: int = 128,
        temperature: float = 0.0,
        seed: int = 0,
        stop: list[str] | None = None,
    ) -> ChatCompletion:
        cacheable = float(temperature) == 0.0
        key = self.key(messages, max_tokens=max_tokens, temperature=temperature, seed=seed, stop=stop)
        files = adapter_files_of(self.model)  # read with the key: what the answer is attributed to
        if cacheable:
            entry = self.cache.get_entry(key)
            if entry is not None:
                hit, original_s = entry
                with self._lock:
                    self.stats.calls += 1
                    self.stats.hits += 1
                    self.stats.replayed_seconds += original_s or 0.0
                    self.stats.untimed_hits += 1 if original_s is None else 0
                return hit
        started = time.perf_counter()
        completion = self.model.chat(messages, max_tokens=max_tokens, temperature=temperature, seed=seed, stop=stop)
        elapsed = time.perf_counter() - started
        if cacheable:
            self.cache.put(key, completion, inference_s=elapsed, adapter_files=files)
        with self._lock:
            self.stats.calls += 1
            self.stats.misses += 1
            self.stats.uncacheable += 0 if cacheable else 1
            self.stats.inference_seconds += elapsed
            self.stats.prompt_tokens_evaluated += int(completion.prompt_tokens)
        return completion
