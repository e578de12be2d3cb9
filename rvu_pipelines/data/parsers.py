"""Parse each data set's files (mirror layout) into one tidy polars frame.

Columns are stable and documented per parser; a malformed file raises an error naming the file.
"""

from __future__ import annotations

import ast
import json
from collections.abc import Callable, Iterable
from pathlib import Path
from typing import Any

import polars as pl

from rvu_pipelines.errors import RvuError

Files = dict[str, Path]


def _read_json(path: Path) -> object:
    try:
        return json.loads(path.read_text(encoding="utf-8"))
    except json.JSONDecodeError as exc:
        raise RvuError(f"{path} is not valid JSON (line {exc.lineno}, column {exc.colno}): {exc.msg}") from exc


def _read_jsonl(path: Path) -> list[dict]:
    rows = []
    for number, line in enumerate(path.read_text(encoding="utf-8").split("\n"), start=1):
        if not line.strip():
            continue
        try:
            rows.append(json.loads(line))
        except json.JSONDecodeError as exc:
            raise RvuError(f"{path} line {number} is not valid JSON: {exc.msg}") from exc
    return rows


def deepset_prompt_injections(files: Files) -> pl.DataFrame:
    """text, label (1 = injection), split (rows 0-545 train, 546-661 test, as upstream)."""
    rows = _read_jsonl(files["prompt_injections.jsonl"])
    train_size = 546
    return pl.DataFrame(
        {
            "text": [r["text"] for r in rows],
            "label": [int(r["label"]) for r in rows],
            "split": ["train" if i < train_size else "test" for i in range(len(rows))],
        },
        schema={"text": pl.String, "label": pl.Int8, "split": pl.String},
    )


def awesome_chatgpt_prompts(files: Files) -> pl.DataFrame:
    """act, prompt, for_devs, type, contributor: benign role prompts."""
    return pl.read_csv(files["prompts.csv"], infer_schema=False).with_columns(
        pl.col("for_devs").str.to_uppercase().eq("TRUE").alias("for_devs")
    )


def trustair_jailbreaks(files: Files) -> pl.DataFrame:
    """prompt, jailbreak, source, platform, date."""
    rows = _read_jsonl(files["jailbreaks.jsonl"])
    return pl.DataFrame(
        {
            "prompt": [r["prompt"] for r in rows],
            "jailbreak": [bool(r["jailbreak"]) for r in rows],
            "source": [r.get("source") for r in rows],
            "platform": [r.get("platform") for r in rows],
            "date": [str(r["date"]) if r.get("date") is not None else None for r in rows],
        }
    )


def _choices(value: str | Iterable[object]) -> list[str]:
    """The mirror stores choices as a Python-literal string; the hub as a list."""
    # literal_eval evaluates literals only, never code
    choices = ast.literal_eval(value) if isinstance(value, str) else value
    return [str(choice) for choice in choices]


def wmdp_cyber(files: Files) -> pl.DataFrame:
    """question, choices (list of 4), answer (index of the correct choice)."""
    rows = _read_json(files["cyber_questions.json"])
    assert isinstance(rows, list)
    return pl.DataFrame(
        {
            "question": [r["question"] for r in rows],
            "choices": [_choices(r["choices"]) for r in rows],
            "answer": [int(r["answer"]) for r in rows],
        },
        schema={"question": pl.String, "choices": pl.List(pl.String), "answer": pl.Int8},
    )


def injecagent(files: Files) -> pl.DataFrame:
    """One row per base test case; setting dh (direct harm) or ds (data stealing)."""
    columns = {
        "Attacker Tools": "attacker_tools",
        "Attacker Instruction": "attacker_instruction",
        "Expected Achievements": "expected_achievements",
        "Attack Type": "attack_type",
        "User Tool": "user_tool",
        "User Instruction": "user_instruction",
        "Tool Parameters": "tool_parameters",
        "Tool Response Template": "tool_response_template",
        "Thought": "thought",
        "Tool Response": "tool_response",
    }
    records = []
    for setting in ("dh", "ds"):
        cases = _read_json(files[f"test_cases_{setting}_base.json"])
        assert isinstance(cases, list)
        for index, case in enumerate(cases):
            record: dict[str, Any] = {"setting": setting, "case_index": index, "modified": bool(case.get("Modifed", 0))}
            record.update({new: case.get(old) for old, new in columns.items()})
            record["attacker_tools"] = list(record["attacker_tools"] or [])
            records.append(record)
    return pl.DataFrame(records, infer_schema_length=None)


def _joined(value: object) -> str:
    """BIPIA code tasks store text as lists of lines."""
    return "\n".join(value) if isinstance(value, list) else str(value)


def bipia(files: Files) -> pl.DataFrame:
    """Tasks (record_type=task: context, question, ideal[, error, code]) and attack strings
    (record_type=attack: task=text|code, category, text) in one frame with shared columns."""
    records = []
    for task in ("email", "table", "code"):
        for split in ("train", "test"):
            for index, row in enumerate(_read_jsonl(files[f"{task}/{split}.jsonl"])):
                records.append(
                    {
                        "record_type": "task",
                        "task": task,
                        "split": split,
                        "index": index,
                        "category": None,
                        "context": _joined(row.get("context", "")),
                        "question": _joined(row["question"]) if "question" in row else None,
                        "ideal": _joined(row.get("ideal", "")),
                        "error": _joined(row["error"]) if "error" in row else None,
                        "code": _joined(row["code"]) if "code" in row else None,
                        "text": None,
                    }
                )
    for kind in ("text", "code"):
        for split in ("train", "test"):
            by_category = _read_json(files[f"{kind}_attack_{split}.json"])
            assert isinstance(by_category, dict)
            for category in sorted(by_category):
                for index, text in enumerate(by_category[category]):
                    records.append(
                        {
                            "record_type": "attack",
                            "task": kind,
                            "split": split,
                            "index": index,
                            "category": category,
                            "context": None,
                            "question": None,
                            "ideal": None,
                            "error": None,
                            "code": None,
                            "text": text,
                        }
                    )
    return pl.DataFrame(records, infer_schema_length=None)


def tofu(files: Files) -> pl.DataFrame:
    """subset (forget | real_authors | world_facts), question, answer, perturbed_answer (retain probes)."""
    records = []
    for subset, rel in (
        ("forget", "forget_qa.jsonl"),
        ("real_authors", "real_authors_perturbed.jsonl"),
        ("world_facts", "world_facts_perturbed.jsonl"),
    ):
        for row in _read_jsonl(files[rel]):
            records.append(
                {
                    "subset": subset,
                    "question": row["question"],
                    "answer": row["answer"],
                    "perturbed_answer": list(row.get("perturbed_answer") or []),
                }
            )
    return pl.DataFrame(
        records,
        schema={
            "subset": pl.String,
            "question": pl.String,
            "answer": pl.String,
            "perturbed_answer": pl.List(pl.String),
        },
    )


def agentpoison_strategyqa(files: Files) -> pl.DataFrame:
    """split train = the agent's memory (term, description, question, answer); test = victim questions."""
    records = []
    for split, rel in (("train", "strategyqa_train_filtered.json"), ("test", "strategyqa_test.json")):
        rows = _read_json(files[rel])
        assert isinstance(rows, list)
        for row in rows:
            answer = row.get("answer")
            records.append(
                {
                    "split": split,
                    "qid": str(row["qid"]),
                    "term": row.get("term"),
                    "description": row.get("description"),
                    "question": row["question"],
                    "answer": None if answer is None else bool(answer),
                }
            )
    return pl.DataFrame(
        records,
        schema={
            "split": pl.String,
            "qid": pl.String,
            "term": pl.String,
            "description": pl.String,
            "question": pl.String,
            "answer": pl.Boolean,
        },
    )


def minja(files: Files) -> pl.DataFrame:
    """victim, session, instruction, with the victim's injection target and target price."""
    victim_targets = _read_json(files["victim_target.json"])
    victim_questions = _read_json(files["victim_questions.json"])
    assert isinstance(victim_targets, list) and isinstance(victim_questions, list)
    targets = {t["victim"]: t for t in victim_targets}
    records = []
    for victim in victim_questions:
        target = targets.get(victim["victim"], {})
        for question in victim["questions"]:
            records.append(
                {
                    "victim": victim["victim"],
                    "session": question["session"],
                    "instruction": question["instruction"],
                    "target": target.get("target"),
                    "target_price": target.get("target_price"),
                }
            )
    return pl.DataFrame(
        records,
        schema={
            "victim": pl.String,
            "session": pl.String,
            "instruction": pl.String,
            "target": pl.String,
            "target_price": pl.Float64,
        },
    )


PARSERS: dict[str, Callable[[Files], pl.DataFrame]] = {
    "deepset_prompt_injections": deepset_prompt_injections,
    "awesome_chatgpt_prompts": awesome_chatgpt_prompts,
    "trustair_jailbreaks": trustair_jailbreaks,
    "wmdp_cyber": wmdp_cyber,
    "injecagent": injecagent,
    "bipia": bipia,
    "tofu": tofu,
    "agentpoison_strategyqa": agentpoison_strategyqa,
    "minja": minja,
}
