"""Reuse of a prompt prefix's llama.cpp KV state: chunk-aligned (warm == cold), in RAM, and on disk.

**Why aligned.** llama.cpp's floats for a position depend on how that position was evaluated: a
generated token is decoded alone (batch 1) while a cold prompt evaluates the same position inside a
chunk, and the two round differently (SmolLM2-135M: max |Δlogit| 0.71 when the next turn reuses the
previous answer's KV). So a reused position must have been computed exactly as a cold evaluation
computes it. Prompts are evaluated in chunks of ``CHUNK_TOKENS`` from position 0 (``n_batch`` =
``n_ubatch`` = the chunk, in both modes), and a reuse stops at a multiple of the chunk, no later than
the last *full prompt chunk* of the context it comes from (generated tokens and a partial last chunk
are never reused) and before the new prompt's last token. Warm and cold logits are then bit-identical
(``tests/agents/test_kv_prefixes.py``).

**RAM.** llama-cpp-python reuses only what the previous call left; :class:`KVPrefixStore` keeps
snapshots of contexts a call is about to discard, so interleaved prefixes (an agent and a defense's
judge) are each evaluated once per process.

**Disk.** :class:`KVDiskCache` keeps the prefixes two different prompts shared (the system prompt and
tool schema, not one episode's turns) in files keyed by the model's sha256, the llama.cpp build, the
context settings and the exact tokens, so a new process (a Dagster step, a celery worker, tomorrow's
sweep) starts warm. Files are written atomically and checked against their sha256 when read; the
folder is bounded (least recently used out first). The folder is trusted like the model cache: a
state file is handed to llama.cpp's own loader, so keep it private (it is created 0700).
"""

from __future__ import annotations

import ctypes
import hashlib
import json
import logging
import os
import struct
from collections import OrderedDict
from collections.abc import Callable, Sequence
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

import numpy as np

from rvu_pipelines.atomic_write import atomic_writer
from rvu_pipelines.hashing import sha256_bytes

log = logging.getLogger(__name__)

CHUNK_TOKENS = 64  # prompt-eval chunk = reuse granularity; 64 evaluates as fast as 128-512 on CPU
_MAGIC = b"RVUKV01\n"


def common_prefix(a: Sequence[int] | np.ndarray, b: Sequence[int] | np.ndarray) -> int:
    """Length of the longest common prefix of two token sequences."""
    n = min(len(a), len(b))
    if n == 0:
        return 0
    differ = np.flatnonzero(np.asarray(a[:n], dtype=np.int64) != np.asarray(b[:n], dtype=np.int64))
    return int(differ[0]) if differ.size else n


@dataclass(frozen=True)
class KVNamespace:
    """Everything besides the tokens that a KV state's bytes depend on; part of every disk key."""

    model_sha256: str
    llama_build: str  # llama_cpp version + native libraries + CPU features + runtime settings
    n_ctx: int
    n_threads: int
    chunk_tokens: int
    adapter_key: str  # "" for the base model
    # sha256 of the adapter GGUFs behind adapter_key: recorded in each file's header so an eviction finds the
    # states computed under an adapter; not part of the digest (adapter_key already keys them apart)
    adapter_files: tuple[str, ...] = ()

    @property
    def digest(self) -> str:
        fields = asdict(self)
        del fields["adapter_files"]
        return sha256_bytes(json.dumps(fields, sort_keys=True).encode())


def aligned(n: int, chunk: int) -> int:
    return (max(n, 0) // chunk) * chunk


# ------------------------------------------------------------------------------------------ disk tier


@dataclass(frozen=True)
class _DiskEntry:
    path: Path
    namespace: str
    tokens: np.ndarray


def _computed_under(header: dict[str, Any], adapter_files: set[str] | None) -> bool:
    """Whether a state file's header says it was computed under one of ``adapter_files`` (None: any adapter).
    A file with an adapter key but no recorded files cannot be attributed, so it counts as under every one."""
    fields = header.get("namespace_fields")
    if not isinstance(fields, dict) or not fields.get("adapter_key"):
        return False
    files = fields.get("adapter_files")
    if adapter_files is None or not isinstance(files, list):
        return True
    return bool(adapter_files.intersection(str(sha) for sha in files))


class KVDiskCache:
    """KV prefix states in files ``<sha256(namespace, tokens)>.kv``: header, tokens, state bytes.

    Safe to share between processes: a file appears by ``os.replace`` of a finished temp file each writer
    made for itself (:mod:`rvu_pipelines.atomic_write`), every read checks the state's sha256, and a file
    another process evicted meanwhile is simply a miss.
    """

    def __init__(self, directory: Path | str, capacity_bytes: int = 1 << 30) -> None:
        self.directory = Path(directory)
        self.capacity_bytes = int(capacity_bytes)
        self._entries: dict[str, _DiskEntry] = {}
        self._listed_mtime: int | None = None
        self.hits = 0
        self.writes = 0

    def key(self, namespace: KVNamespace, tokens: Sequence[int]) -> str:
        material = namespace.digest.encode() + np.asarray(tokens, dtype="<i4").tobytes()
        return hashlib.sha256(material).hexdigest()

    def _path(self, key: str) -> Path:
        return self.directory / f"{key}.kv"

    def _refresh(self) -> None:
        """Re-read the headers when the folder changed (its mtime moves on every create, rename, delete)."""
        try:
            mtime = self.directory.stat().st_mtime_ns
        except FileNotFoundError:
            self._entries, self._listed_mtime = {}, None
            return
        if mtime == self._listed_mtime:
            return
        entries: dict[str, _DiskEntry] = {}
        for path in self.directory.glob("*.kv"):
            known = self._entries.get(path.stem)
            if known is not None:
                entries[path.stem] = known
                continue
            header = self._read_header(path)
            if header is not None:
                entries[path.stem] = header
        self._entries, self._listed_mtime = entries, mtime

    @staticmethod
    def _read(path: Path, with_state: bool) -> tuple[dict[str, Any], np.ndarray, bytes] | None:
        """(header, tokens, state bytes or b"") of a file, or None when it is missing or not one of ours."""
        try:
            with open(path, "rb") as handle:
                if handle.read(len(_MAGIC)) != _MAGIC:
                    return None
                (length,) = struct.unpack("<I", handle.read(4))
                header = json.loads(handle.read(length))
                n_tokens = int(header["n_tokens"])
                tokens = np.frombuffer(handle.read(4 * n_tokens), dtype="<i4").astype(np.int64)
                state = handle.read() if with_state else b""
        except (OSError, ValueError, KeyError, struct.error):
            return None
        return (header, tokens, state) if tokens.size == n_tokens else None

    def _read_header(self, path: Path) -> _DiskEntry | None:
        read = self._read(path, with_state=False)
        return None if read is None else _DiskEntry(path, str(read[0].get("namespace")), read[1])

    def best(self, namespace: KVNamespace, tokens: Sequence[int], limit: int) -> tuple[int, _DiskEntry | None]:
        """The stored prefix sharing the most tokens (at most ``limit``) with ``tokens`` in ``namespace``."""
        self._refresh()
        digest, best_len, best = namespace.digest, 0, None
        for entry in self._entries.values():
            if entry.namespace != digest or entry.tokens.size > limit or entry.tokens.size <= best_len:
                continue
            if common_prefix(entry.tokens, tokens) == entry.tokens.size:  # a stored state is used whole
                best_len, best = int(entry.tokens.size), entry
        return best_len, best

    def contains(self, namespace: KVNamespace, tokens: Sequence[int]) -> bool:
        return self._path(self.key(namespace, tokens)).is_file()

    def read_state(self, entry: _DiskEntry) -> bytes | None:
        """The state bytes, or None when the file vanished, is truncated or fails its checksum."""
        read = self._read(entry.path, with_state=True)
        if read is None:
            return None
        header, _, state = read
        if len(state) != int(header.get("state_bytes", -1)) or sha256_bytes(state) != header.get("state_sha256"):
            log.warning("KV prefix file %s is damaged (size or sha256 mismatch); ignoring it", entry.path)
            return None
        try:
            os.utime(entry.path)  # least recently *used* goes first
        except OSError:
            pass
        self.hits += 1
        return state

    def write(self, namespace: KVNamespace, tokens: Sequence[int], state: bytes) -> Path:
        self.directory.mkdir(parents=True, exist_ok=True, mode=0o700)
        key = self.key(namespace, tokens)
        target = self._path(key)
        header = json.dumps(
            {
                "namespace": namespace.digest,
                "namespace_fields": asdict(namespace),
                "n_tokens": len(tokens),
                "state_bytes": len(state),
                "state_sha256": sha256_bytes(state),
            },
            sort_keys=True,
        ).encode()
        # each writer has its own temp file (mkstemp), so processes writing the same key never mix bytes;
        # no fsync: a file a power cut tore fails its sha256 and is a miss
        with atomic_writer(target, fsync=False) as handle:
            handle.write(_MAGIC + struct.pack("<I", len(header)) + header)
            handle.write(np.asarray(tokens, dtype="<i4").tobytes())
            handle.write(state)
        self.writes += 1
        self.evict()
        return target

    def evict(self) -> None:
        """Delete least recently used files until the folder is within ``capacity_bytes``."""
        files = []
        for path in self.directory.glob("*.kv"):
            try:
                stat = path.stat()
            except FileNotFoundError:
                continue
            files.append((stat.st_mtime_ns, stat.st_size, path))
        total = sum(size for _, size, _ in files)
        for _, size, path in sorted(files):
            if total <= self.capacity_bytes:
                break
            path.unlink(missing_ok=True)
            total -= size

    def size_bytes(self) -> int:
        return sum(p.stat().st_size for p in self.directory.glob("*.kv")) if self.directory.exists() else 0

    def files_under(self, adapter_files: Sequence[str] | None) -> list[Path]:
        """The state files computed under any of ``adapter_files`` (None: under any adapter), sorted."""
        wanted = None if adapter_files is None else {str(sha) for sha in adapter_files}
        found = []
        for path in sorted(self.directory.glob("*.kv")) if self.directory.exists() else []:
            read = self._read(path, with_state=False)
            if read is not None and _computed_under(read[0], wanted):
                found.append(path)
        return found

    def purge_adapter_files(self, adapter_files: Sequence[str] | None) -> int:
        """Delete the state files computed under any of ``adapter_files`` (None: any adapter); the count."""
        paths = self.files_under(adapter_files)
        for path in paths:
            path.unlink(missing_ok=True)
        return len(paths)


# ------------------------------------------------------------------------------------------ the store


@dataclass
class _KVSnapshot:
    tokens: tuple[int, ...]
    state: bytes


def _seq_state(llm: Any) -> bytes | None:
    import llama_cpp

    ctx = llm._ctx.ctx
    size = int(llama_cpp.llama_state_seq_get_size(ctx, 0))
    if size <= 0:
        return None
    buffer = (ctypes.c_uint8 * size)()
    written = int(llama_cpp.llama_state_seq_get_data(ctx, buffer, size, 0))
    return ctypes.string_at(buffer, written) if written > 0 else None


def _set_seq_state(llm: Any, state: bytes) -> bool:
    import llama_cpp

    llm._ctx.kv_cache_seq_rm(-1, 0, -1)
    buffer = (ctypes.c_uint8 * len(state)).from_buffer_copy(state)
    return int(llama_cpp.llama_state_seq_set_data(llm._ctx.ctx, buffer, len(state), 0)) == len(state)


def _truncate(llm: Any, n: int) -> None:
    """Keep the first ``n`` positions of the live context (KV and token record)."""
    if n < llm.n_tokens:
        llm._ctx.kv_cache_seq_rm(-1, n, -1)
        llm.n_tokens = n


class KVPrefixStore:
    """Chunk-aligned prefix reuse for one ``Llama`` (module doc): live context, RAM snapshots, disk.

    ``prepare(llm, tokens)`` runs before each ``generate``: it leaves the live context holding exactly
    the prefix this call may reuse (possibly restored from RAM or disk), so llama-cpp-python's own
    prefix match reuses that and evaluates the rest in aligned chunks. ``capacity_bytes=0`` keeps no
    snapshots (reuse of the live context only, still aligned).
    """

    def __init__(
        self,
        capacity_bytes: int = 512 << 20,
        min_tokens: int = CHUNK_TOKENS,
        *,
        chunk_tokens: int = CHUNK_TOKENS,
        disk: KVDiskCache | None = None,
        namespace: Callable[[], KVNamespace] | None = None,
    ) -> None:
        if disk is not None and namespace is None:
            raise ValueError("KVPrefixStore: a disk tier needs the namespace its files are keyed by")
        self.capacity_bytes = int(capacity_bytes)
        self.min_tokens = max(1, int(min_tokens))
        self.chunk_tokens = int(chunk_tokens)
        self.disk = disk
        self._namespace = namespace
        self._snapshots: OrderedDict[tuple[int, ...], _KVSnapshot] = OrderedDict()
        self._live_prompt_len = 0  # the live context's prompt; what follows it was generated
        self.saves = 0
        self.restores = 0
        self.disk_restores = 0
        self.reused_tokens = 0

    def __len__(self) -> int:
        return len(self._snapshots)

    @property
    def size_bytes(self) -> int:
        return sum(len(s.state) for s in self._snapshots.values())

    def clear(self) -> None:
        """Forget the RAM snapshots and the live context's alignment (disk files stay: other keys)."""
        self._snapshots.clear()
        self._live_prompt_len = 0

    def prepare(self, llm: Any, tokens: Sequence[int]) -> None:
        tokens = list(tokens)
        chunk = self.chunk_tokens
        limit = aligned(len(tokens) - 1, chunk)  # the last prompt token is always evaluated (its logits)
        live_prompt = llm.input_ids[: min(int(llm.n_tokens), self._live_prompt_len)]
        live_end = aligned(live_prompt.size, chunk)  # positions evaluated in full prompt chunks
        live_common = common_prefix(live_prompt, tokens)
        reuse = aligned(min(live_common, live_end, limit), chunk)
        if live_end - reuse >= self.min_tokens and self.capacity_bytes > 0:
            self._save(llm, tuple(int(t) for t in live_prompt[:live_end]))
        source: _KVSnapshot | None = None
        source_common = live_common
        for snapshot in self._snapshots.values():
            common = common_prefix(snapshot.tokens, tokens)
            if aligned(min(common, limit), chunk) >= reuse + self.min_tokens:
                reuse, source, source_common = aligned(min(common, limit), chunk), snapshot, common
        from_disk = False
        if self.disk is not None and self._namespace is not None:
            disk_len, entry = self.disk.best(self._namespace(), tokens, limit)
            if entry is not None and disk_len >= reuse + self.min_tokens:
                state = self.disk.read_state(entry)
                if state is not None:
                    source = _KVSnapshot(tuple(int(t) for t in entry.tokens), state)
                    reuse, source_common, from_disk = disk_len, disk_len, True
        if source is not None:
            if _set_seq_state(llm, source.state):
                n = len(source.tokens)
                llm.input_ids[:n] = source.tokens
                llm.n_tokens = n
                if from_disk:
                    self.disk_restores += 1
                else:
                    self._snapshots.move_to_end(source.tokens)
                    self.restores += 1
            else:  # a failed restore leaves nothing reusable: evaluate the prompt from scratch
                llm.reset()
                llm._ctx.kv_cache_seq_rm(-1, 0, -1)
                if not from_disk:
                    self._snapshots.pop(source.tokens, None)
                reuse = 0
        _truncate(llm, reuse)
        self.reused_tokens += reuse
        source_end = len(source.tokens) if source is not None else live_prompt.size
        if self.disk is not None and reuse >= self.min_tokens and source_common < source_end:
            # two different prompts shared these tokens (a system prompt, not one conversation's turns)
            self._persist(llm, tokens[:reuse])
        self._live_prompt_len = len(tokens)  # generate() evaluates this prompt from ``reuse`` in aligned chunks

    def _save(self, llm: Any, tokens: tuple[int, ...]) -> None:
        _truncate(llm, len(tokens))  # the state then holds exactly these (aligned) positions
        state = _seq_state(llm)
        if state is None or len(state) > self.capacity_bytes:
            return
        for key in [k for k in self._snapshots if len(k) <= len(tokens) and tokens[: len(k)] == k]:
            del self._snapshots[key]  # superseded by this longer snapshot
        self._snapshots[tokens] = _KVSnapshot(tokens, state)
        self.saves += 1
        while self.size_bytes > self.capacity_bytes and self._snapshots:
            self._snapshots.popitem(last=False)

    def _persist(self, llm: Any, tokens: list[int]) -> None:
        assert self.disk is not None and self._namespace is not None
        namespace = self._namespace()
        if self.disk.contains(namespace, tokens):
            return
        state = _seq_state(llm)  # the live context holds exactly ``tokens`` now
        if state is None or len(state) > self.disk.capacity_bytes:
            return
        try:
            self.disk.write(namespace, tokens, state)
        except OSError as exc:  # a full or read-only disk costs speed, never a result
            log.warning("could not write a KV prefix to %s: %s", self.disk.directory, exc)
