"""Chat prompts as token ids in which only the chat template can produce control tokens.

llama-cpp-python's chat path renders the template to one string and tokenizes it with ``special=True``,
so message content (tool outputs, retrieved memory, documents: untrusted text) holding
``<|im_end|>\\n<|im_start|>user\\n...`` becomes real control tokens there, a forged turn. Here the template is
rendered with every content replaced by a random sentinel; the rendering is cut at the sentinels into
the template's own pieces, and only those pieces are searched for special-token text. Content is
tokenized as plain text (``special=False``), so a content string can never yield a control token.

For content without control-token text the ids equal that path's bit for bit (response caches, KV
prefixes and golden results depend on it), because this mirrors llama.cpp's own ``special=True``
tokenization: it first partitions the text at special-token strings (longest first, honouring the
tokens' lstrip/rstrip attributes) and then tokenizes each raw fragment as plain text. Each maximal raw
run (template text + content + template text) is therefore tokenized in one piece, exactly as llama.cpp
tokenizes the same raw fragment.

Only ``content`` is treated as untrusted: roles and any other message fields are rendered as template
text (the platform sets them). A template that transforms or branches on content (``| trim``, escaping)
is refused with ``ChatTemplateError`` rather than tokenized some other way.
"""

from __future__ import annotations

import re
import secrets
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

_WHITESPACE = b" \t\n\v\f\r"  # C isspace() in the "C" locale, which llama.cpp's lstrip/rstrip use


class ChatTemplateError(ValueError):
    """The chat template cannot be rendered with content kept apart from template text."""


@dataclass(frozen=True)
class SpecialToken:
    """A token llama.cpp matches by its text when ``special=True`` (control, user-defined or unknown)."""

    id: int
    text: bytes
    control: bool  # control/unknown: never produced from plain text (user-defined tokens are)
    lstrip: bool
    rstrip: bool


@dataclass(frozen=True)
class ChatPrompt:
    """What the model is given for ``messages``: ``tokens`` to evaluate, plus the chat format's stops."""

    tokens: list[int]
    text: str  # the full rendering, as llama-cpp-python's chat path tokenizes it
    add_special: bool  # whether that path asks the tokenizer to add BOS/EOS
    stop: list[str]
    stopping_criteria: Any  # llama_cpp.StoppingCriteriaList or None (the template's end-of-turn id)


@dataclass(frozen=True)
class _Content:
    """Message content inside the fragment list: raw text that is never searched for special tokens."""

    text: bytes


Fragment = bytes | SpecialToken


def special_tokens(llama: Any) -> tuple[SpecialToken, ...]:
    """The vocabulary's special tokens in the order llama.cpp's tokenizer searches for them (longest text
    first; equal lengths by id, where llama.cpp's unstable sort leaves the order unspecified)."""
    import llama_cpp

    vocab = llama._model.vocab
    searched = llama_cpp.LLAMA_TOKEN_ATTR_CONTROL | llama_cpp.LLAMA_TOKEN_ATTR_USER_DEFINED
    searched |= llama_cpp.LLAMA_TOKEN_ATTR_UNKNOWN
    control = llama_cpp.LLAMA_TOKEN_ATTR_CONTROL | llama_cpp.LLAMA_TOKEN_ATTR_UNKNOWN
    found: list[SpecialToken] = []
    for token_id in range(int(llama_cpp.llama_vocab_n_tokens(vocab))):
        attr = int(llama_cpp.llama_vocab_get_attr(vocab, token_id))
        if not attr & searched:
            continue
        text = llama_cpp.llama_vocab_get_text(vocab, token_id) or b""
        if text:  # an empty text matches nowhere (llama.cpp would not terminate on it either)
            found.append(
                SpecialToken(
                    token_id,
                    bytes(text),
                    bool(attr & control),
                    bool(attr & llama_cpp.LLAMA_TOKEN_ATTR_LSTRIP),
                    bool(attr & llama_cpp.LLAMA_TOKEN_ATTR_RSTRIP),
                )
            )
    return tuple(sorted(found, key=lambda token: (-len(token.text), token.id)))


def partition(text: bytes, specials: Sequence[SpecialToken]) -> list[Fragment]:
    """``text`` split at special-token strings as llama.cpp's ``tokenizer_st_partition`` does with
    ``parse_special=True``: each token in turn (``specials`` in search order) splits every raw fragment at
    each occurrence, stripping whitespace on its left (lstrip) or right (rstrip) where its attributes say."""
    fragments: list[Fragment] = [text] if text else []
    for special in specials:
        split: list[Fragment] = []
        for fragment in fragments:
            if not isinstance(fragment, bytes):
                split.append(fragment)
                continue
            rest = fragment
            while rest:
                at = rest.find(special.text)
                if at < 0:
                    split.append(rest)
                    break
                left = rest[:at].rstrip(_WHITESPACE) if special.lstrip else rest[:at]
                if left:
                    split.append(left)
                split.append(special)
                rest = rest[at + len(special.text) :]
                if special.rstrip:
                    rest = rest.lstrip(_WHITESPACE)
        fragments = split
    return fragments


def raw_runs(fragments: Sequence[Fragment | _Content]) -> list[Fragment]:
    """Adjacent template text and content joined into one raw run each (llama.cpp sees one fragment
    there), with whitespace next to an lstrip/rstrip special token stripped as llama.cpp strips it."""
    merged: list[bytearray | SpecialToken] = []
    for fragment in fragments:
        raw = fragment.text if isinstance(fragment, _Content) else fragment
        if isinstance(raw, SpecialToken):
            merged.append(raw)
        elif merged and isinstance(merged[-1], bytearray):
            merged[-1] += raw
        else:
            merged.append(bytearray(raw))
    runs: list[Fragment] = [bytes(f) if isinstance(f, bytearray) else f for f in merged]
    for index, fragment in enumerate(runs):
        if not isinstance(fragment, SpecialToken):
            continue
        before = runs[index - 1] if index > 0 else None
        after = runs[index + 1] if index + 1 < len(runs) else None
        if fragment.lstrip and isinstance(before, bytes):
            runs[index - 1] = before.rstrip(_WHITESPACE)
        if fragment.rstrip and isinstance(after, bytes):
            runs[index + 1] = after.lstrip(_WHITESPACE)
    return [fragment for fragment in runs if not isinstance(fragment, bytes) or fragment]


ChatFormatter = Callable[..., Any]  # llama_cpp.llama_chat_format.ChatFormatter


def _builtin_formatters() -> dict[str, ChatFormatter]:
    """The formats ``Llama`` falls back to or guesses from GGUF metadata without a Jinja handler."""
    from llama_cpp import llama_chat_format as formats

    return {
        "chatml": formats.format_chatml,
        "llama-2": formats.format_llama2,
        "llama-3": formats.format_llama3,
        "mistral-instruct": formats.format_mistral_instruct,
    }


def _jinja_formatter(llama: Any, template: str) -> ChatFormatter:
    """The formatter ``Llama.__init__`` builds for a GGUF template (same bos/eos text and stop id)."""
    from llama_cpp.llama_chat_format import Jinja2ChatFormatter

    eos_id, bos_id = int(llama.token_eos()), int(llama.token_bos())
    return Jinja2ChatFormatter(
        template=template,
        eos_token=llama._model.token_get_text(eos_id) if eos_id != -1 else "",
        bos_token=llama._model.token_get_text(bos_id) if bos_id != -1 else "",
        stop_token_ids=[eos_id],
    )


def chat_formatter(llama: Any, template: str | None = None) -> tuple[str, ChatFormatter]:
    """(name, formatter) of what ``llama.create_chat_completion`` renders with: the GGUF's Jinja template
    (``tokenizer.chat_template``) or the built-in format llama-cpp-python picked; ``template`` overrides."""
    if template is not None:
        return "given template", _jinja_formatter(llama, template)
    if llama.chat_handler is not None:
        raise ChatTemplateError(
            f"{_model_name(llama)}: a custom chat_handler ({llama.chat_handler!r}) renders this model's prompts; "
            "its template cannot be seen, so content cannot be kept apart from it."
        )
    name = str(llama.chat_format)
    if name in llama._chat_handlers:  # a template from the GGUF metadata
        key = "tokenizer.chat_template" if name == "chat_template.default" else f"tokenizer.{name}"
        return f"GGUF {key}", _jinja_formatter(llama, llama.metadata[key])
    builtin = _builtin_formatters().get(name)
    if builtin is None:
        raise ChatTemplateError(
            f"{_model_name(llama)}: chat format {name!r} is not one this module can render with content kept "
            f"apart (supported: the GGUF's own template, {', '.join(sorted(_builtin_formatters()))})."
        )
    return f"llama-cpp-python chat format {name!r}", builtin


def _model_name(llama: Any) -> str:
    return Path(str(getattr(llama, "model_path", "") or "model")).name


def _stops(stop: str | list[str] | None) -> list[str]:
    return [] if stop is None else [stop] if isinstance(stop, str) else list(stop)


class ChatTokenizer:
    """Turns chat messages into the token ids a llama.cpp model receives, control tokens from the
    template only. One per loaded model (the special-token table and the compiled template are kept)."""

    def __init__(self, llama: Any, *, template: str | None = None, model_name: str | None = None) -> None:
        from llama_cpp.llama_tokenizer import LlamaTokenizer

        if not isinstance(llama.tokenizer_, LlamaTokenizer):
            raise ChatTemplateError(
                f"{_model_name(llama)}: tokenizer {type(llama.tokenizer_).__name__} is not llama.cpp's own; "
                "only llama.cpp's tokenization is reproduced here."
            )
        self._llama = llama
        self.model_name = model_name or _model_name(llama)
        self.template_name, self._formatter = chat_formatter(llama, template)
        self.specials = special_tokens(llama)
        self.control_ids = frozenset(token.id for token in self.specials if token.control)
        self._prefix, self._suffix = self._added_special_tokens()

    def _added_special_tokens(self) -> tuple[list[int], list[int]]:
        """What ``tokenize(..., add_bos=True)`` puts before and after the text (BOS/EOS per the vocab)."""
        plain = self._llama.tokenize(b"a", add_bos=False, special=False)
        wrapped = self._llama.tokenize(b"a", add_bos=True, special=False)
        for start in range(len(wrapped) - len(plain) + 1):
            if wrapped[start : start + len(plain)] == plain:
                return list(wrapped[:start]), list(wrapped[start + len(plain) :])
        raise ChatTemplateError(f"{self.model_name}: cannot tell which tokens add_bos adds ({wrapped} vs {plain}).")

    def prompt(self, messages: Sequence[Mapping[str, Any]]) -> ChatPrompt:
        """The token ids for ``messages`` (with the chat format's stop strings). Raises ``ChatTemplateError``
        when the template does not place each content verbatim (e.g. it trims or escapes it)."""
        contents: list[str] = []
        for index, message in enumerate(messages):
            content = message.get("content")
            if content is not None and not isinstance(content, str):
                raise ChatTemplateError(f"message {index}: content must be text, not {type(content).__name__}.")
            contents.append(content or "")
        nonce = secrets.token_hex(16)
        while any(nonce in content for content in contents):  # 128 random bits: never in practice
            nonce = secrets.token_hex(16)
        sentinel = re.compile(f"rvu{nonce}m([0-9]+)x")
        skeleton_messages = [
            {**message, "content": f"rvu{nonce}m{index}x"} if contents[index] else dict(message)
            for index, message in enumerate(messages)
        ]
        skeleton = self._formatter(messages=skeleton_messages)
        rendered = self._formatter(messages=[dict(message) for message in messages])
        parts = sentinel.split(str(skeleton.prompt))
        pieces, order = parts[0::2], [int(index) for index in parts[1::2]]
        verbatim = "".join(piece + (contents[order[k]] if k < len(order) else "") for k, piece in enumerate(pieces))
        if verbatim != rendered.prompt:
            raise ChatTemplateError(
                f"{self.model_name}: the chat template ({self.template_name}) does not render message content "
                "verbatim (it transforms or branches on it), so content cannot be tokenized apart from the "
                "template. Pass content the template keeps as is, or render with a template that does."
            )
        fragments: list[Fragment | _Content] = []
        for k, piece in enumerate(pieces):
            fragments.extend(partition(piece.encode("utf-8"), self.specials))
            if k < len(order):
                fragments.append(_Content(contents[order[k]].encode("utf-8")))
        tokens: list[int] = []
        for fragment in raw_runs(fragments):
            if isinstance(fragment, SpecialToken):
                tokens.append(fragment.id)
                continue
            ids = [int(t) for t in self._llama.tokenize(fragment, add_bos=False, special=False)]
            if self.control_ids.intersection(ids):  # a vocabulary whose merges spell a control token
                raise ChatTemplateError(f"{self.model_name}: plain-text tokenization produced a control token.")
            tokens.extend(ids)
        add_special = not rendered.added_special
        if add_special:
            tokens = [*self._prefix, *tokens, *self._suffix]
        return ChatPrompt(tokens, str(rendered.prompt), add_special, _stops(rendered.stop), rendered.stopping_criteria)

    def legacy_tokens(self, prompt: ChatPrompt) -> list[int]:
        """How ``create_chat_completion`` tokenized the same rendering (every special string parsed):
        the reference benign prompts must equal, and what forged turns came from."""
        return [
            int(t) for t in self._llama.tokenize(prompt.text.encode("utf-8"), add_bos=prompt.add_special, special=True)
        ]

    def count_control(self, tokens: Sequence[int]) -> int:
        """How many of ``tokens`` are control tokens."""
        return sum(1 for token in tokens if token in self.control_ids)


# ------------------------------------------------------------------ servers whose tokenizer is out of sight

# A server declaring this header (value "plain-text") tokenizes message content as plain text itself, as
# ``models.llama_server`` does with ``ChatTokenizer``; the client then needs no defense of its own.
PLAIN_CONTENT_HEADER = "X-RVU-Chat-Content"
PLAIN_CONTENT_VALUE = "plain-text"

# Control-token strings of widespread chat formats. ``<|name|>`` is matched as a pattern: ChatML (Qwen,
# SmolLM), Llama-3, Phi-3 and most newer families spell their control tokens that way.
WELL_KNOWN_CONTROL_TOKENS: tuple[str, ...] = (
    "<|im_start|>",  # ChatML
    "<|im_end|>",
    "<|endoftext|>",
    "<|begin_of_text|>",  # Llama-3
    "<|start_header_id|>",
    "<|end_header_id|>",
    "<|eot_id|>",
    "<|eom_id|>",
    "<|system|>",  # Phi-3
    "<|user|>",
    "<|assistant|>",
    "<|end|>",
    "[INST]",  # Llama-2, Mistral
    "[/INST]",
    "<<SYS>>",
    "<</SYS>>",
    "<s>",
    "</s>",
    "[SYSTEM_PROMPT]",  # Mistral v3+
    "[/SYSTEM_PROMPT]",
    "[AVAILABLE_TOOLS]",
    "[/AVAILABLE_TOOLS]",
    "[TOOL_CALLS]",
    "[TOOL_RESULTS]",
    "[/TOOL_RESULTS]",
    "<start_of_turn>",  # Gemma
    "<end_of_turn>",
    "<bos>",
    "<eos>",
)
_CONTROL_STRING = re.compile(
    "|".join(
        [
            r"<\|[A-Za-z0-9_.:/-]{1,64}\|>",
            "<\uff5c[^\uff5c<>\\n]{1,64}\uff5c>",  # DeepSeek's full-width bars: <｜User｜>, <｜end▁of▁sentence｜>
            *(re.escape(token) for token in sorted(WELL_KNOWN_CONTROL_TOKENS, key=len, reverse=True)),
        ]
    )
)


class ControlTokenError(ValueError):
    """Message content holds a chat control-token string and the policy is to refuse it."""


def control_strings(text: str) -> list[str]:
    """The well-known chat control-token strings in ``text``, in order."""
    return [match.group(0) for match in _CONTROL_STRING.finditer(text)]


def neutralise_control_strings(text: str) -> str:
    """``text`` with a space after the first character of every well-known control-token string
    (``<|im_start|>`` becomes ``< |im_start|>``): still readable, no longer the token's exact text.
    A visible space, not a zero-width character, because some tokenizer normalisers delete those."""
    while True:
        neutralised = _CONTROL_STRING.sub(lambda match: f"{match.group(0)[0]} {match.group(0)[1:]}", text)
        if neutralised == text:
            return text
        text = neutralised
