"""The deployment's own texts for evaluating and training prompt-injection detectors.

The public corpora (:mod:`corpora`) are chat prompts and jailbreaks; what a deployed detector actually scores
are the tool outputs of the platform's three agent benchmarks. This module collects them, as the agent reads them:

* ``benign``: tool outputs without an injection.
* ``payloads``: the injection texts an attacker plants in a tool output.
* ``injected``: whole tool outputs carrying an injection, built the way the benchmark itself builds them (label 1).

Per source:

* **AgentDojo** (installed ``agentdojo``, the pinned benchmark version): benign = the outputs of every user
  task's ground-truth calls on the suite's default environment, through ``FunctionsRuntime.run_function`` and
  ``tool_result_to_str`` (what AgentDojo's ``ToolsExecutor`` hands the model by default). Payloads = the text
  the platform's native attack (``agentdojo_tasks.ATTACK``, model name ``ATTACK_MODEL_KEY``) plants for each
  injection task; it does not depend on the user task. Injected = the ground-truth outputs of user tasks run on
  the environment with that payload planted, kept where the agent reads the payload (:func:`carries_payload`),
  at most ``AGENTDOJO_USER_TASKS_PER_INJECTION`` user tasks per injection task.
* **BIPIA**: benign = the task contexts (email / table / code); payloads = the text and code attacks;
  injected = a context with an attack of its kind inserted by ``scenarios.bipia.insert_attack`` (one attack and
  position per context, chosen by sha256 of the ids).
* **InjecAgent**: InjecAgent ships no benign fill for its tool responses, so benign = each distinct
  ``tool_response_template`` with the ``<Attacker Instruction>`` placeholder replaced by an empty string;
  payloads = the distinct attacker instructions; injected = the test cases' ``tool_response`` (unquoted as the
  platform's scenario serves it).

Splits (train / calib / test; calib is for threshold calibration). Groups are ordered by sha256 of the group
string within a stratum (an AgentDojo suite, an InjecAgent setting) and cut at 60 % / 80 %, so even a
handful of groups (InjecAgent's 17 user tools) gets all three splits. BIPIA keeps its own train/test; its
test contexts (and test attacks) are halved into calib and test the same way, by id. Payloads have no calib:
a payload group in the calib band is a ``test`` payload. No text is in two splits of a frame: an exact
duplicate is dropped from the later split (train, calib, test order).

Injected rows leak no split. Each is built from a payload and a context (the same tool output without the
injection), and both are in the row's split: the row takes the payload's band (a test payload never appears
in a train row; calib and test rows never share a payload), and its context's band must be the same. A
context's band is its benign text's split; AgentDojo is the exception: its few injectable outputs (49 in
v1.2.2) are shared by many user tasks, so the user-task split puts nearly all of their benign texts in train,
and those in train are re-banded 60/20/20 by sha256 of their benign id. So no train row holds a calib/test
benign text, no two splits' rows share a context, and a calib/test AgentDojo row may hold a train benign
text (label 0 there) with an unseen payload in it, which is the deployment's situation: known tools, a new
attack. An injected id is ``<payload id>@<where>``, so the payload of any injected row can be looked up.

Texts keep their whitespace as the agent sees it. Frames are sorted by (source, split, id); ids are unique.
"""

from __future__ import annotations

import hashlib
from collections.abc import Callable, Collection, Iterable, Sequence
from dataclasses import dataclass
from functools import lru_cache
from typing import Any, NamedTuple

import polars as pl

from rvu_pipelines.detectors.corpora import require_columns
from rvu_pipelines.errors import DatasetUnavailableError, DetectorError

SOURCES: tuple[str, ...] = ("agentdojo", "bipia", "injecagent")
SPLITS: tuple[str, ...] = ("train", "calib", "test")
COLUMNS: dict[str, type[pl.DataType]] = dict.fromkeys(("id", "text", "source", "group", "split"), pl.String)
BANDS: tuple[tuple[str, float], ...] = (("train", 0.6), ("calib", 0.8), ("test", 1.0))
HALVES: tuple[tuple[str, float], ...] = (("calib", 0.5), ("test", 1.0))
_RANK = {split: rank for rank, split in enumerate(SPLITS)}
PLACEHOLDER = "<Attacker Instruction>"
AGENTDOJO_USER_TASKS_PER_INJECTION = 3

DATASETS: dict[str, str] = {"bipia": "BIPIA contexts and attacks", "injecagent": "InjecAgent test cases"}
_BIPIA_COLUMNS = ("record_type", "task", "split", "index", "category", "context", "text")
_INJECAGENT_COLUMNS = tuple(
    "setting case_index attacker_tools attacker_instruction user_tool tool_response_template tool_response".split()
)


@dataclass(frozen=True)
class DeploymentTexts:
    """The deployment's texts; each frame has columns id, text, source, group, split (see the module doc)."""

    benign: pl.DataFrame
    payloads: pl.DataFrame
    injected: pl.DataFrame

    def frames(self) -> dict[str, pl.DataFrame]:
        return {"benign": self.benign, "payloads": self.payloads, "injected": self.injected}

    def counts(self) -> dict[str, dict[str, int]]:
        """Rows per frame and ``source/split``, e.g. {"benign": {"agentdojo/train": 80, ...}, ...}."""
        out: dict[str, dict[str, int]] = {}
        for name, frame in self.frames().items():
            grouped = frame.group_by("source", "split").len().sort("source", "split")
            out[name] = {f"{r['source']}/{r['split']}": int(r["len"]) for r in grouped.iter_rows(named=True)}
        return out


class _Row(NamedTuple):
    id: str
    text: str
    source: str
    group: str
    split: str


_Parts = tuple[tuple[_Row, ...], tuple[_Row, ...], tuple[_Row, ...]]  # (benign, payloads, injected)


def _digest(key: str) -> str:
    return hashlib.sha256(key.encode()).hexdigest()


def _rank_split(
    keys: Iterable[str], cuts: Sequence[tuple[str, float]] = BANDS, stratum: Callable[[str], str] = lambda _: ""
) -> dict[str, str]:
    """key -> split: within each stratum, keys ordered by sha256 and cut at the cumulative fractions ``cuts``."""
    strata: dict[str, list[str]] = {}
    for key in sorted(set(keys)):
        strata.setdefault(stratum(key), []).append(key)
    out: dict[str, str] = {}
    for members in strata.values():
        members.sort(key=_digest)
        bounds = [(name, round(fraction * len(members))) for name, fraction in cuts]
        for rank, key in enumerate(members):
            out[key] = next(name for name, bound in bounds if rank < bound)
    return out


def _payload_split(band: str) -> str:
    """Payloads have no calib: a payload whose injected rows are calibration rows is a test payload."""
    return "train" if band == "train" else "test"


def _dedupe(rows: Iterable[_Row]) -> list[_Row]:
    """Exact duplicates dropped: the earliest split wins (train, calib, test), then the earlier row."""
    ordered = sorted(enumerate(rows), key=lambda pair: (_RANK[pair[1].split], pair[0]))
    seen: set[str] = set()
    kept: list[tuple[int, _Row]] = []
    for order, row in ordered:
        if row.text not in seen:
            seen.add(row.text)
            kept.append((order, row))
    return [row for _, row in sorted(kept)]


def carries_payload(text: str, payload: str) -> bool:
    """Whether the agent reading ``text`` reads ``payload``, up to whitespace.

    AgentDojo plants a payload in its YAML environment (which folds the payload's blank lines) and the tool
    output is YAML again (which may quote and escape it), so the payload is rarely a literal substring: both
    are compared with whitespace runs collapsed, against the raw text and against its YAML-decoded strings.
    """
    import yaml

    needle = " ".join(payload.split())
    if not needle:
        return False
    if needle in " ".join(text.split()):
        return True
    try:
        decoded = yaml.load(text, Loader=getattr(yaml, "CSafeLoader", yaml.SafeLoader))
    except yaml.YAMLError:
        return False
    return needle in " ".join(" ".join(_strings(decoded)).split())


def _strings(value: object) -> list[str]:
    if isinstance(value, str):
        return [value]
    if isinstance(value, dict):
        return [s for key, item in value.items() for s in (*_strings(key), *_strings(item))]
    if isinstance(value, list):
        return [s for item in value for s in _strings(item)]
    return []


def _frame(rows: Iterable[_Row]) -> pl.DataFrame:
    rows = _dedupe(rows)
    frame = pl.DataFrame({column: [getattr(row, column) for row in rows] for column in COLUMNS}, schema=COLUMNS)
    if not frame["id"].is_unique().all():
        duplicated = sorted(set(frame.filter(frame["id"].is_duplicated())["id"]))
        raise DetectorError(f"Deployment texts: ids are not unique: {duplicated[:5]}.")
    return frame.sort("source", "split", "id")


# ---------------------------------------------------------------- BIPIA


def bipia_texts(frame: pl.DataFrame) -> _Parts:
    """(benign, payloads, injected) rows from the ``bipia`` data set frame."""
    from rvu_pipelines.scenarios.bipia import POSITIONS, attack_key, insert_attack
    from rvu_pipelines.scenarios.common import stable_choice

    require_columns(frame, "bipia", _BIPIA_COLUMNS)
    tasks = frame.filter(pl.col("record_type") == "task").sort("task", "split", "index")
    attacks = frame.filter(pl.col("record_type") == "attack").sort("task", "split", "category", "index")

    contexts = [
        (f"bipia:{r['task']}:{r['split']}:{r['index']}", r["task"], r["split"], r["context"] or "")
        for r in tasks.iter_rows(named=True)
    ]
    halves = _rank_split([c[0] for c in contexts if c[2] == "test"], HALVES, lambda key: key.split(":")[1])
    benign = _dedupe(
        _Row(cid, text, "bipia", task, halves.get(cid, split)) for cid, task, split, text in contexts if text.strip()
    )

    entries = [
        (
            f"bipia:{r['task']}_attack:{r['split']}:{attack_key(r['category'] or '', int(r['index']))}",
            r["task"],
            r["split"],
            r["category"] or "",
            r["text"] or "",
        )
        for r in attacks.iter_rows(named=True)
    ]
    attack_halves = _rank_split([e[0] for e in entries if e[2] == "test"], HALVES, lambda key: key.split(":")[1])
    band = {aid: attack_halves.get(aid, split) for aid, _, split, _, _ in entries}
    payloads = _dedupe(
        _Row(aid, text, "bipia", f"{kind}:{category}", _payload_split(band[aid]))
        for aid, kind, _, category, text in entries
        if text.strip()
    )
    kept = {row.id for row in payloads}
    attack_text = {aid: text for aid, _, _, _, text in entries}
    by_band: dict[tuple[str, str], list[str]] = {}
    for aid, kind, _, _, _ in entries:
        if aid in kept:
            by_band.setdefault((kind, band[aid]), []).append(aid)

    injected = []
    for row in benign:
        choices = by_band.get(("code" if row.group == "code" else "text", row.split), [])
        if not choices:
            continue
        aid = stable_choice(sorted(choices), row.id)
        position = stable_choice(POSITIONS, row.id, aid)
        text = insert_attack(row.text, attack_text[aid], position)
        where = row.id.removeprefix("bipia:")
        injected.append(_Row(f"{aid}@{where}:{position}", text, "bipia", row.group, row.split))
    return tuple(benign), tuple(payloads), tuple(_dedupe(injected))


# ---------------------------------------------------------------- InjecAgent


def injecagent_texts(frame: pl.DataFrame) -> _Parts:
    """(benign, payloads, injected) rows from the ``injecagent`` data set frame.

    InjecAgent ships no benign fill, so a benign text is a response template with the placeholder emptied. The
    injected texts are the cases' responses as served; GoogleCalendarReadEvents' differ from its template
    beyond the instruction (``\\"`` for ``"``), a cue that only its injected rows carry.
    """
    from rvu_pipelines.scenarios.injecagent import unquote_response

    require_columns(frame, "injecagent", _INJECAGENT_COLUMNS)
    cases = list(frame.sort("setting", "case_index").iter_rows(named=True))

    templates: dict[tuple[str, str], str] = {}  # (user tool, template) -> benign id
    for case in cases:
        key = (case["user_tool"], case["tool_response_template"])
        if key not in templates:
            number = sum(tool == key[0] for tool, _ in templates)
            templates[key] = f"injecagent:{key[0]}:{number}"
    tool_split = _rank_split(tool for tool, _ in templates)
    benign = _dedupe(
        _Row(bid, template.replace(PLACEHOLDER, ""), "injecagent", tool, tool_split[tool])
        for (tool, template), bid in templates.items()
    )
    context_split = {row.text: row.split for row in benign}

    instructions: dict[tuple[str, str], tuple[str, str]] = {}  # (setting, instruction) -> (payload id, group)
    for case in cases:
        key = (case["setting"], case["attacker_instruction"] or "")
        if key not in instructions:
            number = sum(setting == key[0] for setting, _ in instructions)
            group = f"{key[0]}:{'+'.join(case['attacker_tools'] or [])}"
            instructions[key] = (f"injecagent:{key[0]}:attacker_case_{number}", group)
    band = _rank_split((group for _, group in instructions.values()), stratum=lambda group: group.split(":")[0])
    payloads = _dedupe(
        _Row(pid, text, "injecagent", group, _payload_split(band[group]))
        for (_, text), (pid, group) in instructions.items()
        if text.strip()
    )

    injected = []
    for case in cases:
        instruction = case["attacker_instruction"] or ""
        pid, group = instructions[(case["setting"], instruction)]
        text = unquote_response(case["tool_response"] or "")
        context = case["tool_response_template"].replace(PLACEHOLDER, "")
        if instruction and instruction in text and context_split[context] == band[group]:
            where = f"{case['setting']}:case_{case['case_index']}"
            injected.append(_Row(f"{pid}@{where}", text, "injecagent", case["user_tool"], band[group]))
    return tuple(benign), tuple(payloads), tuple(_dedupe(injected))


# ---------------------------------------------------------------- AgentDojo


def _agentdojo_suites(benchmark_version: str) -> dict[str, Any]:
    from rvu_pipelines.data.agentdojo_suites import installed_agentdojo_version

    installed_agentdojo_version()  # a clear error naming the pip fix when the package is missing
    from rvu_pipelines.scenarios.agentdojo_tasks import suites

    return suites(benchmark_version)


def _ground_truth_outputs(
    runtime: Any, task: Any, env: Any, only: Collection[int] | None = None
) -> list[tuple[str, str | None]]:
    """(function, text the agent reads) per ground-truth call of ``task`` on a copy of ``env``; None for an
    error, an empty output or a call not in ``only`` (rendering is the slow part)."""
    from agentdojo.agent_pipeline.tool_execution import tool_result_to_str

    env_t = task.init_environment(env.model_copy(deep=True))
    outputs: list[tuple[str, str | None]] = []
    for k, call in enumerate(task.ground_truth(env_t)):
        result, error = runtime.run_function(env_t, call.function, dict(call.args))
        text = tool_result_to_str(result) if only is None or k in only else ""
        outputs.append((call.function, None if error or not text.strip() else text))
    return outputs


def agentdojo_texts(benchmark_version: str, suite_names: Iterable[str] | None = None) -> _Parts:
    """(benign, payloads, injected) rows of the AgentDojo ``benchmark_version``'s suites (default: all).

    Splits are drawn per suite, so a suite's rows are the same whichever other suites are loaded. Cached per
    (version, suites): the result depends on nothing else and takes seconds to build.
    """
    names = None if suite_names is None else tuple(sorted(set(suite_names)))
    return _agentdojo_texts(benchmark_version, names)


@lru_cache(maxsize=4)
def _agentdojo_texts(benchmark_version: str, suite_names: tuple[str, ...] | None) -> _Parts:
    """The rows of :func:`agentdojo_texts`.

    Injected outputs: the ground-truth calls that read an injection vector are found once per suite with
    AgentDojo's canaries; per injection task the environment is loaded once with the payload in every vector
    (the attack plants the vectors a user task's ground truth reads, and only those reach the agent, so the
    outputs are the same), and user tasks with a context in the payload's band, ordered by sha256, are run until
    ``AGENTDOJO_USER_TASKS_PER_INJECTION`` of them gave a new row.
    """
    from agentdojo.functions_runtime import FunctionsRuntime

    from rvu_pipelines.scenarios.agentdojo_tasks import ATTACK, agentdojo_attack, natural_task_order

    available = _agentdojo_suites(benchmark_version)
    unknown = sorted(set(suite_names or ()) - set(available))
    if unknown:
        raise DetectorError(f"AgentDojo {benchmark_version} has no suite {unknown}; allowed: {sorted(available)}.")
    available = {name: available[name] for name in suite_names or available}
    vectors = {name: list(suite.get_injection_vector_defaults()) for name, suite in available.items()}
    clean: dict[tuple[str, str], list[tuple[str, str | None]]] = {}
    reads: dict[tuple[str, str], list[int]] = {}  # the calls whose output shows an injection vector
    for name in sorted(available):
        suite = available[name]
        runtime = FunctionsRuntime(suite.tools)
        env = suite.load_and_inject_default_environment({})
        canaries = {vector: f"<CANARY---{vector}--->" for vector in vectors[name]}
        canary_env = suite.load_and_inject_default_environment(canaries)
        for uid in sorted(suite.user_tasks, key=natural_task_order):
            task = suite.user_tasks[uid]
            outputs = clean[(name, uid)] = _ground_truth_outputs(runtime, task, env)
            marked = _ground_truth_outputs(runtime, task, canary_env)
            reads[(name, uid)] = [
                k
                for k, (function, text) in enumerate(marked[: len(outputs)])
                if text and outputs[k][0] == function and any(c in text for c in canaries.values())
            ]
    user_split = _rank_split((f"{s}:{u}" for s, u in clean), stratum=lambda group: group.split(":")[0])
    benign = _dedupe(
        _Row(f"agentdojo:{s}:{u}:{k}", text, "agentdojo", f"{s}:{u}", user_split[f"{s}:{u}"])
        for (s, u), outputs in clean.items()
        for k, (_, text) in enumerate(outputs)
        if text is not None
    )
    benign_row = {row.text: row for row in benign}
    injectable = {clean[key][k][1] for key, ks in reads.items() for k in ks} - {None}
    rows_of = sorted((benign_row[text] for text in injectable if text is not None), key=lambda row: row.id)
    reband = _rank_split((r.id for r in rows_of if r.split == "train"), stratum=lambda rid: rid.split(":")[1])
    context_band = {r.text: reband.get(r.id, r.split) for r in rows_of}

    planted: dict[str, tuple[str, str, str]] = {}  # payload group -> (suite, injection task, text)
    for name in sorted(available):
        suite, attack = available[name], agentdojo_attack(benchmark_version, name, ATTACK)
        for iid in sorted(suite.injection_tasks, key=natural_task_order):
            planted[f"{name}:{iid}"] = (name, iid, _attack_text(attack, suite, list(suite.user_tasks), iid))
    band = _rank_split(planted, stratum=lambda group: group.split(":")[0])
    payloads = _dedupe(
        _Row(f"agentdojo:{group}", text, "agentdojo", group, _payload_split(band[group]))
        for group, (_, _, text) in planted.items()
    )

    injected: list[_Row] = []
    for group, (name, _, payload) in planted.items():
        suite, split = available[name], band[group]
        runtime = FunctionsRuntime(suite.tools)
        env = suite.load_and_inject_default_environment(dict.fromkeys(vectors[name], payload))

        def fits(key: tuple[str, str], k: int, split: str = split) -> bool:
            context = clean[key][k][1]
            return context_band.get(context, split) == split if context is not None else True

        users = [u for s, u in reads if s == name and any(fits((s, u), k) for k in reads[(s, u)])]
        seen: set[str] = set()
        used = 0
        for uid in sorted(users, key=lambda u: _digest(f"{group}:{u}")):
            wanted = [k for k in reads[(name, uid)] if fits((name, uid), k)]
            outputs = _ground_truth_outputs(runtime, suite.user_tasks[uid], env, wanted)
            rows = [
                _Row(f"agentdojo:{group}@{uid}:{k}", text, "agentdojo", f"{name}:{uid}", split)
                for k in wanted
                if k < len(outputs)
                and (text := outputs[k][1]) is not None
                and text not in seen
                and carries_payload(text, payload)
            ]
            seen.update(row.text for row in rows)
            injected.extend(rows)
            used += bool(rows)
            if used == AGENTDOJO_USER_TASKS_PER_INJECTION:
                break
    return tuple(benign), tuple(payloads), tuple(_dedupe(injected))


def _attack_text(attack: Any, suite: Any, user_ids: Sequence[str], injection_id: str) -> str:
    """The attack's text for ``injection_id`` (the same for every vector and user task of the platform's attack)."""
    from rvu_pipelines.scenarios.agentdojo_tasks import natural_task_order

    for uid in sorted(user_ids, key=natural_task_order):
        try:
            injections = attack.attack(suite.user_tasks[uid], suite.injection_tasks[injection_id])
        except ValueError:  # AgentDojo: this user task reads no injection vector
            continue
        texts = sorted(set(injections.values()))
        if len(texts) != 1:
            raise DetectorError(
                f"AgentDojo attack '{attack.name}' plants {len(texts)} different texts for {suite.name} "
                f"{injection_id}; the deployment texts expect one payload per injection task."
            )
        return texts[0]
    raise DetectorError(f"AgentDojo suite {suite.name}: no user task reads an injection vector.")


# ---------------------------------------------------------------- loading


def _load_frames(source: object | None) -> dict[str, pl.DataFrame]:
    from rvu_pipelines.data import default_dataset_source, load_catalog, load_dataset

    catalog = load_catalog()
    data_source = source or default_dataset_source()
    frames = {}
    for name, what in DATASETS.items():
        try:
            frames[name] = load_dataset(catalog.get(name), data_source).frame  # type: ignore[arg-type]
        except DatasetUnavailableError as exc:
            raise DatasetUnavailableError(
                f"The deployment texts need the '{name}' data set ({what}) from configs/datasets.yaml, "
                f"which could not be read: {exc}"
            ) from exc
    return frames


def _benchmark_version() -> str:
    from rvu_pipelines.scenarios.registry import load_benchmarks_config

    return str(load_benchmarks_config().agentdojo_version)


def load_deployment_texts(source: object | None = None, *, benchmark_version: str | None = None) -> DeploymentTexts:
    """The benign tool outputs, payloads and injected tool outputs of AgentDojo, BIPIA and InjecAgent.

    ``source``: a data set source (default: the mirror or public sources, ``default_dataset_source``);
    ``benchmark_version``: AgentDojo's (default: configs/benchmarks.yaml ``agentdojo.benchmark_version``).
    Deterministic: the same data and package give equal frames.
    """
    frames = _load_frames(source)  # the data sets first: a missing one fails before AgentDojo's slow part
    parts = [
        agentdojo_texts(benchmark_version or _benchmark_version()),
        bipia_texts(frames["bipia"]),
        injecagent_texts(frames["injecagent"]),
    ]
    benign, payloads, injected = (_frame(row for part in parts for row in part[i]) for i in range(3))
    return DeploymentTexts(benign=benign, payloads=payloads, injected=injected)
