"""A peft LoRA trained on the de-quantised agent model, written as a GGUF LoRA adapter llama.cpp loads.

The agent runs the Q4_1 GGUF in llama.cpp; adapters are trained with peft on the same weights in
transformers (``training``). llama.cpp applies an adapter at run time (``W x + scale * B (A x)`` on the
quantised ``W``), so the file only carries A and B, renamed and re-oriented the way llama.cpp's own
converter does it. What was taken from where (ggml-org/llama.cpp, read from the public repository at
the commits named):

* ``convert_lora_to_gguf.py`` @0b03adaa (``LoraModel.set_type`` / ``set_gguf_parameters`` / ``get_tensors`` /
  ``modify_tensors``): metadata ``general.type = "adapter"`` (``gguf.GGUFType.ADAPTER``),
  ``adapter.type = "lora"``, ``adapter.lora.alpha`` as float32, ``general.architecture`` of the base
  model ("llama" for SmolLM2); a peft name is reduced to its base weight by dropping
  ``base_model.model.`` and turning ``.lora_A.weight`` / ``.lora_B.weight`` into ``.weight``; after the
  base model's own name mapping the pair is written as ``<gguf name>.lora_a`` / ``.lora_b`` with A and
  B as peft stores them (A ``[rank, in]``, B ``[out, rank]`` in numpy order, i.e. ggml ``ne`` =
  ``{in, rank}`` and ``{rank, out}``); F32 is the converter's default ``--outtype``.
* ``conversion/llama.py`` @0274f0fc (``LlamaModel.permute`` and ``modify_tensors``, same code in
  ``convert_hf_to_gguf.py`` of older trees): the HF -> GGUF rotary permutation
  ``w.reshape(n_head, 2, out // n_head // 2, ...).swapaxes(1, 2).reshape(w.shape)`` on the rows of
  ``q_proj`` (with ``n_head``) and ``k_proj`` (with ``n_head_kv``). For a LoRA the converter applies
  the same call to a ``LoraTorchTensor``, whose ``reshape``/``swapaxes`` touch only B when the last
  (input) axis is untouched: the rows of B are permuted, A is not (``permute(B A) = permute(B) A``).
* ``src/llama-adapter.cpp`` @0650ea8c (``llama_adapter_lora_init_impl``): the checks the loader makes
  (the three metadata keys, every tensor ending in ``.lora_a`` / ``.lora_b`` and naming a tensor of
  the base model, ``model.ne[0] == a.ne[0]``, ``model.ne[1] == b.ne[1]``, ``a.ne[1] == b.ne[0]``);
  ``src/llama-adapter.h`` (``llama_adapter_lora_weight::get_scale``): the graph scales B A by
  ``adapter_scale * alpha / rank`` with rank ``b.ne[0]`` (a missing alpha means ``adapter_scale`` alone),
  peft's ``alpha / r`` (not rsLoRA).
* gguf-py 0.19.0 (``gguf.TENSOR_NAMES``, ``gguf.Keys``, ``gguf.GGUFWriter``): the block tensor names
  (``blk.{bid}.attn_q`` ... ``ffn_down``) its Llama tensor map gives ``model.layers.{bid}.self_attn.q_proj``
  and friends (the tests check the two agree), the key spellings and the writer.

Checked against transformers + peft on SmolLM2-135M (tests/adapters/test_adapter_gguf_lora.py): the
adapter's effect on the logits agrees, and the same file written without the permutation does not.
"""

from __future__ import annotations

import re
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from rvu_pipelines.atomic_write import atomic_path

ARCHITECTURE = "llama"
_PEFT_NAME = re.compile(
    r"^(?:base_model\.model\.)?model\.layers\.(?P<layer>\d+)\.(?P<block>self_attn|mlp)\."
    r"(?P<module>[a-z_]+)\.lora_(?P<part>[AB])\.weight$"
)
# peft module (last name component) -> (parent block, gguf-py tensor kind)
_MODULES: dict[str, tuple[str, str]] = {
    "q_proj": ("self_attn", "ATTN_Q"),
    "k_proj": ("self_attn", "ATTN_K"),
    "v_proj": ("self_attn", "ATTN_V"),
    "o_proj": ("self_attn", "ATTN_OUT"),
    "gate_proj": ("mlp", "FFN_GATE"),
    "up_proj": ("mlp", "FFN_UP"),
    "down_proj": ("mlp", "FFN_DOWN"),
}


def peft_module_names(n_layers: int) -> list[tuple[str, str]]:
    """(peft module name, llama.cpp weight name) of every linear layer a LoRA can adapt in ``n_layers`` blocks."""
    return [
        (f"model.layers.{layer}.{block}.{module}", gguf_block_name(module, layer))
        for layer in range(n_layers)
        for module, (block, _) in _MODULES.items()
    ]


@dataclass(frozen=True)
class _Pair:
    layer: int
    module: str
    a: np.ndarray
    b: np.ndarray


def gguf_block_name(module: str, layer: int) -> str:
    """llama.cpp's name of the base weight a peft module of ``layer`` adapts (``blk.3.attn_q.weight``)."""
    import gguf

    kind = getattr(gguf.MODEL_TENSOR, _MODULES[module][1])
    return f"{gguf.TENSOR_NAMES[kind].format(bid=layer)}.weight"


def permute_rotary_rows(weights: np.ndarray, n_head: int) -> np.ndarray:
    """llama.cpp's ``LlamaModel.permute`` on the rows (HF rotate-half -> GGUF interleaved rotary pairs)."""
    rows = weights.shape[0]
    if rows % (2 * n_head):
        raise ValueError(f"{rows} rows cannot be split into {n_head} heads of rotary pairs.")
    return np.ascontiguousarray(
        weights.reshape(n_head, 2, rows // n_head // 2, *weights.shape[1:]).swapaxes(1, 2).reshape(weights.shape)
    )


def _as_float32(value: Any, name: str) -> np.ndarray:
    if hasattr(value, "detach"):  # a torch tensor (bfloat16 has no numpy dtype: go through float32)
        value = value.detach().cpu().float().numpy()
    array = np.asarray(value, dtype=np.float32)
    if array.ndim != 2:
        raise ValueError(f"LoRA tensor {name!r} has shape {array.shape}; a LoRA matrix is two-dimensional.")
    if not np.all(np.isfinite(array)):
        raise ValueError(f"LoRA tensor {name!r} holds NaN or infinite values.")
    return array


def _pairs(tensors: Mapping[str, Any], rank: int, target_modules: Iterable[str] | None) -> list[_Pair]:
    """Group A and B per (layer, module); every name that is not a Llama block LoRA matrix is refused."""
    allowed = set(_MODULES) if target_modules is None else set(target_modules)
    unknown_targets = sorted(allowed - set(_MODULES))
    if unknown_targets:
        raise ValueError(f"Cannot write LoRA targets {unknown_targets} to GGUF; known: {', '.join(_MODULES)}.")
    halves: dict[tuple[int, str], dict[str, np.ndarray]] = {}
    for name, value in tensors.items():
        match = _PEFT_NAME.match(name)
        if match is None:
            raise ValueError(
                f"Cannot map LoRA tensor {name!r} to a llama.cpp tensor: only "
                "'base_model.model.model.layers.N.{self_attn,mlp}.<module>.lora_{A,B}.weight' is written "
                "(no embeddings, lm_head, biases, DoRA magnitudes or norms)."
            )
        module = match["module"]
        if module not in _MODULES or _MODULES[module][0] != match["block"]:
            raise ValueError(f"Cannot map LoRA tensor {name!r}: {match['block']}.{module} is not a Llama module.")
        if module not in allowed:
            raise ValueError(f"LoRA tensor {name!r} adapts {module}, which is not among the targets {sorted(allowed)}.")
        halves.setdefault((int(match["layer"]), module), {})[match["part"]] = _as_float32(value, name)
    if not halves:
        raise ValueError("No LoRA tensors to write.")
    pairs = []
    for (layer, module), half in sorted(halves.items()):
        if set(half) != {"A", "B"}:
            raise ValueError(f"Layer {layer} {module}: LoRA needs both lora_A and lora_B, got only {sorted(half)}.")
        a, b = half["A"], half["B"]
        if a.shape[0] != rank or b.shape[1] != rank:
            raise ValueError(
                f"Layer {layer} {module}: lora_A {a.shape} and lora_B {b.shape} do not have rank {rank} "
                "(A is [rank, in], B is [out, rank])."
            )
        pairs.append(_Pair(layer, module, a, b))
    return pairs


def gguf_lora_tensors(
    tensors: Mapping[str, Any],
    *,
    rank: int,
    n_head: int,
    n_head_kv: int,
    target_modules: Iterable[str] | None = None,
) -> dict[str, np.ndarray]:
    """peft names -> llama.cpp names (``blk.N.attn_q.weight.lora_a`` ...), float32, q/k B rows permuted."""
    if rank < 1 or n_head < 1 or n_head_kv < 1:
        raise ValueError("rank, n_head and n_head_kv must be at least 1.")
    arrays: dict[str, np.ndarray] = {}
    for pair in _pairs(tensors, rank, target_modules):
        b = pair.b
        if pair.module == "q_proj":
            b = permute_rotary_rows(b, n_head)
        elif pair.module == "k_proj":
            b = permute_rotary_rows(b, n_head_kv)  # LlamaModel.permute(w, n_head, n_kv_head) uses n_kv_head
        base = gguf_block_name(pair.module, pair.layer)
        arrays[f"{base}.lora_a"] = np.ascontiguousarray(pair.a)
        arrays[f"{base}.lora_b"] = np.ascontiguousarray(b)
    return arrays


def write_gguf_arrays(
    arrays: Mapping[str, np.ndarray],
    *,
    alpha: float,
    out_path: Path | str,
    architecture: str = ARCHITECTURE,
    name: str | None = None,
) -> Path:
    """Write already-named llama.cpp LoRA tensors with the adapter metadata; same input, same bytes.

    The file appears under its final name only once complete (written beside it, then renamed)."""
    import gguf

    if not alpha > 0:
        raise ValueError(f"LoRA alpha must be positive (llama.cpp reads 0 as 'no alpha'), got {alpha}.")
    bad = sorted(k for k in arrays if not k.endswith((".lora_a", ".lora_b")))
    if bad:
        raise ValueError(f"GGUF LoRA tensor names must end in .lora_a or .lora_b: {bad[:3]}.")
    out = Path(out_path)
    with atomic_path(out) as partial:
        writer = gguf.GGUFWriter(str(partial), arch=architecture)
        try:
            writer.add_type(gguf.GGUFType.ADAPTER)
            writer.add_string(gguf.Keys.Adapter.TYPE, "lora")
            writer.add_float32(gguf.Keys.Adapter.LORA_ALPHA, float(alpha))
            if name:
                writer.add_name(name)
            for key in sorted(arrays):
                writer.add_tensor(key, np.ascontiguousarray(arrays[key], dtype=np.float32))
            writer.write_header_to_file()
            writer.write_kv_data_to_file()
            writer.write_tensors_to_file()
        finally:
            writer.close()
    return out


def write_gguf_lora(
    tensors: Mapping[str, Any],
    *,
    rank: int,
    alpha: float,
    out_path: Path | str,
    n_head: int,
    n_head_kv: int,
    target_modules: Iterable[str] | None = None,
    name: str | None = None,
) -> Path:
    """A peft LoRA state dict (``TrainedAdapter.tensors``) as a GGUF LoRA for the Llama-architecture base.

    ``n_head`` / ``n_head_kv`` are the base model's attention heads (SmolLM2-135M: 9 and 3), needed for
    the rotary permutation of q/k; ``target_modules`` (optional) is checked against the tensors. Raises
    ``ValueError`` for any tensor it cannot map, a missing half of a pair or a rank mismatch."""
    arrays = gguf_lora_tensors(tensors, rank=rank, n_head=n_head, n_head_kv=n_head_kv, target_modules=target_modules)
    return write_gguf_arrays(arrays, alpha=alpha, out_path=out_path, name=name)
