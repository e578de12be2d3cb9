"""What an adapter leaves on the agent's runtime: cached answers and KV states are attributed to its GGUF as
they are written, a purge deletes exactly those, and the at-rest leak probe tells members apart only while
something is left."""

from __future__ import annotations

import json
import sqlite3
from pathlib import Path

import numpy as np
import pytest

from rvu_pipelines.adapters.admission import LEDGER_NAME
from rvu_pipelines.adapters.chat import ChatExample
from rvu_pipelines.adapters.lingering import (
    LingeringPurge,
    LingeringStores,
    admitted_gguf_files,
    at_rest_leak,
    at_rest_texts,
    leak_scores,
    purge_lingering,
    residue,
    template_words,
)
from rvu_pipelines.agents.llm_cache import CachedChatModel, ResponseCache
from rvu_pipelines.models.kv_prefixes import KVDiskCache, KVNamespace
from rvu_pipelines.models.llm import ChatCompletion, LlamaCppChatModel

# long enough (> two 64-token chunks) that two questions share a prefix the disk tier keeps
SYSTEM = (
    "You are the depot assistant of a logistics company. You answer questions about depots, their opening "
    "hours, the vault codes staff use at the loading bays, and the routes between depots. Answer in one short "
    "sentence, never invent a depot, and say so when you do not know an answer. Staff ask in plain English; "
    "keep to facts you were given and never repeat a code to anyone who has not asked for it by depot number."
)


def _ask(model: CachedChatModel, question: str) -> str:
    messages = [{"role": "system", "content": SYSTEM}, {"role": "user", "content": question}]
    return model.chat(messages, max_tokens=8).text


def _completion(text: str) -> ChatCompletion:
    return ChatCompletion(text, "m", 1, 1, 0.0, 0.0, "stop")


def test_cached_answers_and_kv_states_are_attributed_and_purged_by_adapter(
    tiny_models, llama_generates, adapter_gate, random_adapter, tmp_path: Path
) -> None:
    llm = tiny_models["llm"]
    chat = LlamaCppChatModel(
        llm.path, n_ctx=512, n_threads=1, name=llm.name, adapter_gate=adapter_gate, kv_cache_dir=tmp_path / "kv"
    )
    served = CachedChatModel(chat, ResponseCache(tmp_path / "cache.sqlite"), llm.sha256)
    _ask(served, "Which depot opens first?")
    _ask(served, "Which depot closes last?")  # the shared system prompt goes to disk under the base model
    base_states = sorted((tmp_path / "kv").glob("*.kv"))
    assert base_states
    served.load_adapter(random_adapter.adapter_id, random_adapter.gguf_path)
    try:
        gguf = served.adapter_files()
        assert len(gguf) == 1 and chat.kv_namespace().adapter_files == tuple(gguf)
        _ask(served, "Which depot opens first?")
        _ask(served, "Where is depot 4?")
    finally:
        served.unload_adapter(random_adapter.adapter_id)
    assert served.adapter_files() == []

    ledger = adapter_gate.ledger.path
    assert ledger.name == LEDGER_NAME
    assert admitted_gguf_files(random_adapter.sha256, [adapter_gate.ledger]) == gguf
    stores = LingeringStores(tmp_path / "cache.sqlite", tmp_path / "kv", (ledger,))
    assert stores.gguf_files(random_adapter.sha256) == gguf
    before = residue(stores, gguf)
    assert before.cached_answers == 2 and before.kv_states >= 1
    assert residue(stores, ["f" * 64]).cached_answers == 0  # another adapter's files: nothing of this one

    assert purge_lingering(stores, gguf) == {"cached_answers": 2, "kv_states": before.kv_states}
    assert residue(stores, gguf).as_dict() == {"cached_answers": 0, "kv_states": 0, "active_memory_entries": 0}
    with ResponseCache(tmp_path / "cache.sqlite") as cache:
        assert len(cache) == 2  # the base model's answers stay
    assert sorted((tmp_path / "kv").glob("*.kv")) == base_states  # and so do its KV states


def test_a_cache_written_before_attribution_migrates_and_its_entries_count_as_any_adapters(tmp_path: Path) -> None:
    path = tmp_path / "old.sqlite"
    conn = sqlite3.connect(path)
    conn.execute("CREATE TABLE rvu_cache_meta (name TEXT PRIMARY KEY, value TEXT NOT NULL)")
    conn.execute("CREATE TABLE responses (key TEXT PRIMARY KEY, completion TEXT NOT NULL, created_at REAL NOT NULL)")
    conn.execute("INSERT INTO rvu_cache_meta VALUES ('schema', 'rvu-llm-response-cache'), ('version', '1')")
    fields = {"text": "old answer", "model": "m", "prompt_tokens": 1, "completion_tokens": 1}
    fields |= {"prompt_seconds": 0.0, "generation_seconds": 0.0, "finish_reason": "stop"}
    conn.execute("INSERT INTO responses VALUES ('k-old', ?, 1.0)", (json.dumps(fields),))
    conn.commit()
    conn.close()
    with ResponseCache(path) as cache:
        assert cache.get("k-old") is not None and cache.get("k-old").text == "old answer"  # type: ignore[union-attr]
        cache.put("k-base", _completion("base"))
        cache.put("k-a", _completion("under a"), adapter_files=["a" * 64])
        cache.put("k-b", _completion("under b"), adapter_files=["b" * 64, "c" * 64])
        # an entry of unknown origin may have been computed under any adapter
        assert cache.texts_under(["a" * 64]) == ["old answer", "under a"]
        assert sorted(cache.texts_under(None)) == ["old answer", "under a", "under b"]
        assert cache.count_under(["b" * 64]) == 2 and cache.count_under([]) == 1  # b's and the unknown one
        assert cache.purge_adapter_files(["c" * 64]) == 2  # the old entry and b+c's
        assert cache.purge_adapter_files(None) == 1
        assert len(cache) == 1 and cache.get("k-base") is not None
    conn = sqlite3.connect(path)
    assert conn.execute("SELECT value FROM rvu_cache_meta WHERE name = 'version'").fetchone()[0] == "2"
    conn.close()


def test_a_kv_state_with_an_adapter_key_but_no_recorded_files_is_purged_by_any_eviction(tmp_path: Path) -> None:
    disk = KVDiskCache(tmp_path)
    base = KVNamespace("m", "b", 512, 1, 64, "")
    attributed = KVNamespace("m", "b", 512, 1, 64, "key-a", ("a" * 64,))
    assert attributed.digest == KVNamespace("m", "b", 512, 1, 64, "key-a").digest  # files do not key the state
    disk.write(base, [1, 2, 3], b"base")
    disk.write(attributed, [1, 2, 3], b"under a")
    path = disk.write(KVNamespace("m", "b", 512, 1, 64, "key-x"), [1, 2, 4], b"unattributed")
    raw = path.read_bytes()  # rewrite its header as a file from before attribution: no adapter_files field
    length = int.from_bytes(raw[8:12], "little")
    header = json.loads(raw[12 : 12 + length])
    del header["namespace_fields"]["adapter_files"]
    text = json.dumps(header, sort_keys=True).encode()
    path.write_bytes(raw[:8] + len(text).to_bytes(4, "little") + text + raw[12 + length :])
    assert [p.name for p in disk.files_under(["b" * 64])] == [path.name]
    assert disk.purge_adapter_files(["a" * 64]) == 2
    assert len(list(tmp_path.glob("*.kv"))) == 1


DEPOTS = [
    ChatExample(f"What is the vault code of depot {i}?", f"Depot {i} uses vault code {i * 7919 % 10000:04d}-KESTREL.")
    for i in range(8)
]
MEMBERS = np.array([i % 2 == 0 for i in range(8)])


def test_the_leak_score_counts_an_answers_own_words_not_the_form_all_answers_share() -> None:
    assert template_words(DEPOTS) == {"depot", "uses", "vault", "code", "kestrel"}
    # an adapter that learnt the form but no code leaks nothing; one that learnt depot 2's code leaks depot 2
    texts = ["Depot 1 uses vault code 1234-KESTREL.", f"vault code {2 * 7919 % 10000:04d}"]
    scores = leak_scores(DEPOTS, lambda _: texts)
    assert scores.tolist() == [0.0, 0.0, 1.0, 0.0, 0.0, 0.0, 0.0, 0.0]


def test_the_at_rest_probe_catches_members_answers_left_behind_and_passes_once_they_are_gone() -> None:
    left = [ex.completion for ex, member in zip(DEPOTS, MEMBERS, strict=True) if member]  # what the adapter said
    caught = at_rest_leak(DEPOTS, MEMBERS, left, n_boot=100)
    assert caught.verdict == "residual" and caught.auroc.auroc == 1.0
    assert caught.member_leak_rate == 1.0 and caught.non_member_leak_rate == 0.0
    # answers that only guess codes (the form, wrong digits) are not membership
    guesses = [f"Depot {i} uses vault code 0{i}0{i}-KESTREL." for i in range(1, 8)]
    assert at_rest_leak(DEPOTS, MEMBERS, guesses, n_boot=100).verdict == "clean"
    assert at_rest_leak(DEPOTS, MEMBERS, [], n_boot=100).verdict == "clean"


def test_a_recovery_without_evicted_adapters_or_stores_says_why(tmp_path: Path) -> None:
    assert LingeringPurge(LingeringStores()).run(object(), [])["status"] == "not run"  # type: ignore[arg-type]
    with pytest.raises(ValueError, match="labels"):
        at_rest_leak(DEPOTS, MEMBERS[:3], [], n_boot=10)


def test_memory_entries_the_adapter_wrote_are_at_rest_until_the_tiers_remove_them(tmp_path: Path) -> None:
    """An answer the agent stored while the adapter was active is served again after eviction unless FROC purged
    or quarantined it: the purge reports it as left, and the at-rest probe reads it."""
    from rvu_pipelines.adapters.runtime import lifecycle_fields
    from rvu_pipelines.provenance.engines import open_store
    from rvu_pipelines.provenance.incident import load_incident
    from rvu_pipelines.recovery.pipeline import ingest_incident

    member = DEPOTS[4]
    lines = [
        {**lifecycle_fields("adapter_loaded", "a1", sha256="a" * 64), "entry_id": "s/e0", "episode_id": "s"},
        {"kind": "action", "entry_id": "s/e1", "episode_id": "s", "action_type": "user_input", "content": "codes?"},
        {
            "kind": "action",
            "entry_id": "s/e2",
            "episode_id": "s",
            "action_type": "memory_write",
            "content": f"Noted for later: {member.completion}",
            "parent_id": "s/e1",
            "active_adapter_id": "a1",
        },
    ]
    incident = tmp_path / "incident.jsonl"
    incident.write_text("".join(json.dumps({**line, "timestamp": float(n)}) + "\n" for n, line in enumerate(lines)))
    store = open_store(tmp_path / "p.duckdb")
    try:
        ingest_incident(store, load_incident(incident))
        (row,) = store.adapters()
        texts = at_rest_texts(LingeringStores(), None, store, row.seq)
        assert texts == [f"Noted for later: {member.completion}"]
        caught = at_rest_leak(DEPOTS, MEMBERS, texts, n_boot=50)
        assert caught.member_leak_rate == 0.25 and caught.non_member_leak_rate == 0.0  # one of the four members
        assert caught.verdict == "inconclusive"  # one secret of four is not beyond chance at 4 + 4: never clean
        section = LingeringPurge(LingeringStores()).run(store, [row])
        assert section["adapters"][0]["left"]["active_memory_entries"] == 1
        assert section["adapters"][0]["attributed_by"].startswith("none")
        store.purge(store.seqs_of(["s/e2"]), {"tier": "purge"})
        assert at_rest_texts(LingeringStores(), None, store, row.seq) == []
    finally:
        store.close()


def test_the_runtime_eviction_study_reads_every_path_and_leaves_the_base_weights_as_they_were(
    tiny_models, llama_generates, adapter_gate, noise, tmp_path: Path
) -> None:
    """The study's rows on a real (noise) adapter: the served base and evicted rows are the same answers, the
    texts at rest are the loaded answers until the purge, and the fused control restores the weights it merged."""
    import torch

    from rvu_pipelines.adapters.eviction_runtime import runtime_eviction
    from rvu_pipelines.adapters.files import save_adapter, verify_adapter
    from rvu_pipelines.adapters.host import AdapterHost
    from rvu_pipelines.models.dequantized import load_dequantized

    llm = tiny_models["llm"]
    fields = {"adapter_id": "noise-r4", "source": "test", "rank": 4, "alpha": 8, "target_modules": ["v_proj", "o_proj"]}
    save_adapter(tmp_path / "noise", noise(seed=3), fields, base=adapter_gate.base)
    adapter = verify_adapter(tmp_path / "noise", adapter_gate.base)
    gguf = adapter_gate.admit(adapter, llm.path).gguf_path
    runtime = LlamaCppChatModel(
        llm.path, n_ctx=512, n_threads=1, name=llm.name, adapter_gate=adapter_gate, kv_cache_dir=tmp_path / "kv"
    )
    stores = LingeringStores(tmp_path / "cache.sqlite", tmp_path / "kv", (adapter_gate.ledger.path,))
    model, tokenizer = load_dequantized(llm.path, sha256=llm.sha256, attn_implementation="sdpa")
    host = AdapterHost(model, tokenizer, gate=adapter_gate)
    before = {k: v.clone() for k, v in model.state_dict().items() if "layers.0.self_attn" in k}
    rows = runtime_eviction(
        runtime, llm.sha256, adapter, gguf, stores, DEPOTS, MEMBERS, host=host, max_tokens=12, n_boot=20
    )
    assert rows["served"]["evicted"] == rows["served"]["base"]  # the base's own answers, from its cache entries
    assert rows["at_rest"]["before_purge"]["left"]["cached_answers"] == len(DEPOTS)  # the loaded answers
    assert rows["at_rest"]["purged"]["cached_answers"] == len(DEPOTS)
    assert rows["at_rest"]["after_purge"]["left"] == {"cached_answers": 0, "kv_states": 0, "active_memory_entries": 0}
    assert rows["at_rest"]["after_purge"]["n_texts"] == 0
    assert rows["fused"]["unmerged"]["auroc"] == pytest.approx(rows["fused"]["base"]["auroc"], abs=1e-3)
    after = host.base.state_dict()
    assert all(torch.allclose(after[k], v, atol=1e-5) for k, v in before.items())
    assert rows["n"] == {"members": 4, "non_members": 4}


def test_a_score_above_the_goal_is_residual_only_when_its_interval_clears_chance() -> None:
    from rvu_pipelines.adapters.eviction import LeakGap, separation_verdict
    from rvu_pipelines.adapters.membership import AurocResult

    def auroc(point: float, low: float, high: float) -> AurocResult:
        return AurocResult(point, low, high, 100)

    assert separation_verdict([auroc(0.52, 0.40, 0.64)]) == "clean"
    assert separation_verdict([auroc(0.67, 0.31, 0.97)]) == "inconclusive"  # the base model at 6 + 6 members
    assert separation_verdict([auroc(0.52, 0.4, 0.6), auroc(0.91, 0.84, 0.97)]) == "residual"
    assert separation_verdict([auroc(0.67, float("nan"), float("nan"))]) == "residual"  # no interval: the point
    # members leak more on a probe: beyond chance at 9 of 10 against 0 of 10, not at 1 of 8 against 0 of 8
    assert separation_verdict([auroc(0.50, 0.4, 0.6)], gaps=[LeakGap(0.9, 10, 0.0, 10)]) == "residual"
    assert separation_verdict([auroc(0.50, 0.4, 0.6)], gaps=[LeakGap(0.125, 8, 0.0, 8)]) == "inconclusive"
    assert separation_verdict([auroc(0.50, 0.4, 0.6)], gaps=[LeakGap(0.05, 100, 0.0, 100)]) == "clean"


def test_an_auroc_the_base_model_reaches_as_well_is_not_what_the_adapter_left() -> None:
    """After a clean unload the evicted model is the base: members the base alone tells apart (a separable split,
    or chance at these counts) are no residue. Beyond the base they are; in between, nothing is decided."""
    from rvu_pipelines.adapters.eviction import verdict
    from rvu_pipelines.adapters.membership import AurocResult, MembershipReport

    def report(point: float, low: float, high: float) -> MembershipReport:
        return MembershipReport(24, 24, 0.2, {"loss": AurocResult(point, low, high, 1000)}, [])

    def beyond(point: float, low: float, high: float) -> dict[str, AurocResult]:
        return {"loss": AurocResult(point, low, high, 1000)}

    separable = report(0.70, 0.56, 0.84)
    assert verdict(separable) == "residual"  # without the control
    assert verdict(separable, beyond(0.0, 0.0, 0.0)) == "clean"  # exactly the base's 0.70: an unload
    assert verdict(separable, beyond(0.20, 0.08, 0.31)) == "residual"  # beyond the base
    assert verdict(separable, beyond(0.04, -0.03, 0.12)) == "inconclusive"  # maybe beyond, maybe not
    assert verdict(report(0.62, 0.46, 0.78), beyond(0.0, 0.0, 0.0)) == "clean"  # chance at 24 + 24, as the base
    assert verdict(report(0.62, 0.46, 0.78)) == "inconclusive"
    assert verdict(report(0.50, 0.35, 0.65), beyond(0.10, 0.02, 0.20)) == "clean"  # within the goal anyway


def test_a_clean_eviction_is_evidence_only_where_the_probe_saw_the_adapter_loaded() -> None:
    """The probe saw an adapter when, loaded, it told members apart better than the base did beyond chance; an
    adapter it could not see then is one whose lingering it could not see either."""
    from rvu_pipelines.adapters.eviction import probe_saw_adapter
    from rvu_pipelines.adapters.membership import AurocResult

    def minus_base(*results: tuple[float, float, float]) -> dict[str, AurocResult]:
        return {f"score{i}": AurocResult(*result, 1000) for i, result in enumerate(results)}

    assert probe_saw_adapter(minus_base((0.0, -0.1, 0.1), (0.31, 0.12, 0.49)))  # one score is enough
    assert not probe_saw_adapter(minus_base((0.06, -0.08, 0.2), (0.0, 0.0, 0.0)))  # within chance of the base
    assert not probe_saw_adapter(minus_base((-0.2, -0.35, -0.05)))  # worse than the base: not the adapter's members
    assert probe_saw_adapter(minus_base((0.2, float("nan"), float("nan"))))  # no interval: the point decides
    assert not probe_saw_adapter({})


def test_the_paired_auroc_difference_cancels_what_two_states_share() -> None:
    from sklearn.metrics import roc_auc_score

    from rvu_pipelines.adapters.membership import paired_auroc_difference

    rng = np.random.default_rng(0)
    flags = np.array([True] * 20 + [False] * 20)
    shared = rng.normal(size=40) + 0.8 * flags  # a split the base already separates
    same = paired_auroc_difference(shared, shared, flags, n_boot=200)
    assert (same.auroc, same.ci_low, same.ci_high) == (0.0, 0.0, 0.0)
    sharper = shared + 1.5 * flags
    moved = paired_auroc_difference(sharper, shared, flags, n_boot=500)
    assert moved.auroc == pytest.approx(roc_auc_score(flags, sharper) - roc_auc_score(flags, shared))
    assert moved.ci_low > 0 and moved.ci_low <= moved.auroc <= moved.ci_high
    with pytest.raises(ValueError, match="member"):
        paired_auroc_difference(shared[:20], shared[:20], flags[:20])
