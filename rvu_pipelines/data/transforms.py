"""Re-serialisations that turn an upstream file into the mirror's layout (see datasets.yaml `derived`)."""

from __future__ import annotations

import json
import re

_INST = re.compile(r"^\s*\[INST\]\s*|\s*\[/INST\]\s*$")


def tofu_eval_log_to_qa(data: bytes) -> bytes:
    """TOFU eval log -> one {question, answer} per line.

    The log's ``generated_text`` maps an index to [prompt, generation, ground truth]; the prompt is
    wrapped in Llama-2 [INST] ... [/INST] tags, which the mirror strips.
    """
    log = json.loads(data)
    generated = log["generated_text"]
    lines = []
    for key in sorted(generated, key=int):
        prompt, _generation, truth = generated[key][:3]
        lines.append(json.dumps({"question": _INST.sub("", prompt).strip(), "answer": truth.strip()}))
    return ("\n".join(lines) + "\n").encode()


def json_records_to_jsonl(data: bytes) -> bytes:
    """A JSON array (or already JSON lines) -> JSON lines."""
    text = data.decode("utf-8").strip()
    if text.startswith("["):
        records = json.loads(text)
    else:
        records = [json.loads(line) for line in text.split("\n") if line.strip()]
    return ("\n".join(json.dumps(r) for r in records) + "\n").encode()


_TRANSFORMS = {"tofu_eval_log_to_qa": tofu_eval_log_to_qa, "json_records_to_jsonl": json_records_to_jsonl}


def apply_transform(name: str, data: bytes) -> bytes:
    return _TRANSFORMS[name](data)
