"""Hostile adapter folders: each is refused with a reason code, a message naming file, field and fix, and
before any tensor is read.

The folder is written by ``save_adapter`` for a hand-made two-layer base, so no model loads and each test
takes well under a second; each case then corrupts one thing (the header's types, its nesting, the manifest's
alpha, a file turned into a symbolic link).
"""

from __future__ import annotations

import json
import shutil
import struct
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
import torch
from hypothesis import HealthCheck, event, given, settings
from hypothesis import strategies as st

from rvu_pipelines.adapters.errors import AdapterRefused
from rvu_pipelines.adapters.files import BaseModelInfo, _read_header, save_adapter, verify_adapter
from rvu_pipelines.adapters.manifest import MANIFEST_NAME, WEIGHTS_NAME, read_manifest
from rvu_pipelines.hashing import sha256_file

HIDDEN, RANK = 32, 4
MODULES = [f"model.layers.{layer}.self_attn.{proj}" for layer in range(2) for proj in ("q_proj", "v_proj")]
BASE = BaseModelInfo(name="tiny-base", sha256="cd" * 32, linear_shapes=dict.fromkeys(MODULES, (HIDDEN, HIDDEN)))
FIELDS: dict[str, object] = {
    "adapter_id": "hostile-probe",
    "label": "benign",
    "category": "test",
    "source": "rvu-tests",
    "rank": RANK,
    "alpha": 2 * RANK,
    "target_modules": ["q_proj", "v_proj"],
}
DEEP = "[" * 200_000 + "]" * 200_000


def _tensors() -> dict[str, torch.Tensor]:
    """A and B of one module hold the same number of floats, so one's offsets fit the other's size."""
    g = torch.Generator().manual_seed(0)
    tensors = {}
    for module in MODULES:
        tensors[f"base_model.model.{module}.lora_A.weight"] = torch.randn(RANK, HIDDEN, generator=g) * 0.01
        tensors[f"base_model.model.{module}.lora_B.weight"] = torch.randn(HIDDEN, RANK, generator=g) * 0.01
    return tensors


def _save(folder: Path) -> Path:
    save_adapter(folder, _tensors(), FIELDS, base=BASE)
    return folder


@pytest.fixture
def folder(tmp_path: Path) -> Path:
    return _save(tmp_path / "adapter")


@pytest.fixture
def no_tensor_reads(monkeypatch: pytest.MonkeyPatch) -> None:
    """Any tensor load fails the test: every refusal here must come from bytes and the header alone."""
    import safetensors.torch

    def forbidden(*args: object, **kwargs: object) -> None:
        raise AssertionError("a tensor was read before the adapter was refused")

    monkeypatch.setattr(safetensors.torch, "load", forbidden)
    monkeypatch.setattr(safetensors.torch, "load_file", forbidden)


def _split(weights: Path) -> tuple[dict[str, Any], bytes]:
    raw = weights.read_bytes()
    (length,) = struct.unpack("<Q", raw[:8])
    return json.loads(raw[8 : 8 + length]), raw[8 + length :]


def _write_weights(folder: Path, header_text: str, data: bytes) -> None:
    """The weights file with this header text, and a manifest re-pinned to it, so the header itself is checked."""
    encoded = header_text.encode("utf-8", "surrogatepass")  # a lone surrogate becomes bytes that are not UTF-8
    weights = folder / WEIGHTS_NAME
    weights.write_bytes(struct.pack("<Q", len(encoded)) + encoded + data)
    _edit_manifest(folder, sha256=sha256_file(weights))


def _edit_manifest(folder: Path, **changes: object) -> None:
    manifest = json.loads((folder / MANIFEST_NAME).read_text())
    (folder / MANIFEST_NAME).write_text(json.dumps({**manifest, **changes}))


def _refusal(folder: Path) -> AdapterRefused:
    with pytest.raises(AdapterRefused) as caught:
        verify_adapter(folder, BASE)
    return caught.value


def test_a_valid_adapter_still_verifies(folder: Path) -> None:
    verified = verify_adapter(folder, BASE)
    assert set(verified.tensors) == set(_tensors())
    assert verified.manifest.scaling == 2.0
    assert all(torch.equal(verified.tensors[name], tensor) for name, tensor in _tensors().items())
    header, _ = _split(folder / WEIGHTS_NAME)
    assert set(_read_header(folder / WEIGHTS_NAME)) == set(header)


# each case edits the parsed header: (header, first tensor, second tensor, data section length)
Edit = Callable[[dict[str, Any], str, str, int], None]


def _set(field: str, value: object) -> Edit:
    def edit(header: dict[str, Any], first: str, second: str, size: int) -> None:
        header[first][field] = value

    return edit


def _offsets(make: Callable[[int, int, int], object]) -> Edit:
    def edit(header: dict[str, Any], first: str, second: str, size: int) -> None:
        begin, end = header[first]["data_offsets"]
        header[first]["data_offsets"] = make(begin, end, size)

    return edit


def _overlap(header: dict[str, Any], first: str, second: str, size: int) -> None:
    header[second]["data_offsets"] = list(header[first]["data_offsets"])


def _not_an_object(header: dict[str, Any], first: str, second: str, size: int) -> None:
    header[first] = [header[first]["dtype"], header[first]["shape"]]


def _no_offsets(header: dict[str, Any], first: str, second: str, size: int) -> None:
    del header[first]["data_offsets"]


def _metadata_number(header: dict[str, Any], first: str, second: str, size: int) -> None:
    header["__metadata__"] = {"format": 1}


WRONG_TYPES: dict[str, tuple[Edit, str]] = {
    "offsets as strings": (_offsets(lambda b, e, n: [str(b), str(e)]), "field 'data_offsets'"),
    "offsets as bools": (_offsets(lambda b, e, n: [False, True]), "field 'data_offsets'"),
    "offsets as floats": (_offsets(lambda b, e, n: [float(b), float(e)]), "field 'data_offsets'"),
    "offsets reversed": (_offsets(lambda b, e, n: [e, b]), "field 'data_offsets'"),
    "offsets negative": (_offsets(lambda b, e, n: [b - e - 1, -1]), "field 'data_offsets'"),
    "offsets past the data": (_offsets(lambda b, e, n: [b, n + 64]), "field 'data_offsets'"),
    "three offsets": (_offsets(lambda b, e, n: [b, e, e]), "field 'data_offsets'"),
    "offsets an object": (_offsets(lambda b, e, n: {"begin": b, "end": e}), "field 'data_offsets'"),
    "offsets missing": (_no_offsets, "field 'data_offsets'"),
    "offsets overlap another tensor": (_overlap, "overlap or gap"),
    "offsets span the wrong size": (_offsets(lambda b, e, n: [b, e - 4]), "field 'data_offsets'"),
    "dtype a number": (_set("dtype", 7), "field 'dtype'"),
    "dtype null": (_set("dtype", None), "field 'dtype'"),
    "dtype an integer type": (_set("dtype", "I64"), "field 'dtype'"),
    "shape a string": (_set("shape", f"{RANK}x{HIDDEN}"), "field 'shape'"),
    "shape of floats": (_set("shape", [float(RANK), float(HIDDEN)]), "field 'shape'"),
    "shape of bools": (_set("shape", [True, HIDDEN]), "field 'shape'"),
    "shape negative": (_set("shape", [-RANK, -HIDDEN]), "field 'shape'"),
    "shape nested": (_set("shape", [[RANK], [HIDDEN]]), "field 'shape'"),
    "shape of another size": (_set("shape", [RANK, HIDDEN + 1]), "takes"),
    "entry not an object": (_not_an_object, "not an object"),
    "metadata not strings": (_metadata_number, "field '__metadata__'"),
}


@pytest.mark.parametrize("case", sorted(WRONG_TYPES))
def test_header_fields_of_the_wrong_type_or_range_are_refused(case: str, folder: Path, no_tensor_reads: None) -> None:
    edit, fragment = WRONG_TYPES[case]
    header, data = _split(folder / WEIGHTS_NAME)
    first, second = sorted(name for name in header if name != "__metadata__")[:2]
    edit(header, first, second, len(data))
    _write_weights(folder, json.dumps(header), data)
    refusal = _refusal(folder)
    assert refusal.reason == "corrupted", str(refusal)
    assert fragment in str(refusal) and WEIGHTS_NAME in str(refusal) and "re-export" in str(refusal)


@pytest.mark.parametrize(
    ("case", "text", "fragment"),
    [
        ("not a JSON object", "[]", "not a JSON object"),
        ("duplicate key", '{"__metadata__": {}, "__metadata__": {}}', "duplicate key"),
        ("integer over the digit limit", '{"t": {"data_offsets": [0, ' + "9" * 5000 + "]}}", "not valid JSON"),
        ("extra data after the data section", None, "data section"),
    ],
)
def test_header_text_that_is_not_a_safetensors_header_is_refused(
    case: str, text: str | None, fragment: str, folder: Path, no_tensor_reads: None
) -> None:
    header, data = _split(folder / WEIGHTS_NAME)
    if text is None:
        text, data = json.dumps(header), data + bytes(16)
    _write_weights(folder, text, data)
    refusal = _refusal(folder)
    assert refusal.reason == "corrupted" and fragment in str(refusal), str(refusal)


@pytest.mark.parametrize(
    ("text", "fragment"),
    [
        (DEEP, "nesting deeper than"),
        ('{"__metadata__": ' + DEEP + "}", "nesting deeper than"),
        ('{"t": {"dtype": "F32", "shape": ' + DEEP + ', "data_offsets": [0, 0]}}', "nesting deeper than"),
        ("[" * 200_000, "do not pair up"),
    ],
    ids=["bare", "in metadata", "in a shape", "unclosed"],
)
def test_a_deeply_nested_header_is_refused(text: str, fragment: str, folder: Path, no_tensor_reads: None) -> None:
    _, data = _split(folder / WEIGHTS_NAME)
    _write_weights(folder, text, data)
    refusal = _refusal(folder)
    assert refusal.reason == "corrupted" and fragment in str(refusal), str(refusal)[:300]
    assert WEIGHTS_NAME in str(refusal) and "re-export" in str(refusal)
    with pytest.raises(AdapterRefused) as parser:  # the header parser alone refuses it too
        _read_header(folder / WEIGHTS_NAME)
    assert parser.value.reason == "corrupted"


@pytest.mark.parametrize(
    "text",
    [DEEP, '{"adapter_id": "hostile-probe", "description": ' + DEEP + "}", "{" * 200_000],
    ids=["bare", "in a field", "unclosed"],
)
def test_a_deeply_nested_manifest_is_refused(text: str, folder: Path, no_tensor_reads: None) -> None:
    (folder / MANIFEST_NAME).write_text(text)
    refusal = _refusal(folder)
    assert refusal.reason == "bad_manifest", str(refusal)[:300]
    message = str(refusal)
    assert MANIFEST_NAME in message and "not valid UTF-8 JSON" in message and "re-save" in message
    assert "nesting deeper than" in message or "do not pair up" in message


@pytest.mark.parametrize(
    ("alpha", "rank", "reason", "fragment"),
    [
        (10**40, RANK, "unsafe_scaling", "over the bound of 10000"),
        (1e40, RANK, "unsafe_scaling", "over the bound of 10000"),
        (10_001, 256, "unsafe_scaling", "over the bound of 10000"),
        (100 * RANK, RANK, "unsafe_scaling", "alpha / rank"),
        (float("nan"), RANK, "unsafe_scaling", "not a finite number"),
        (float("inf"), RANK, "unsafe_scaling", "not a finite number"),
        (True, RANK, "bad_manifest", "valid integer"),
        ("8", RANK, "bad_manifest", "valid integer"),
        (8.0, RANK, "bad_manifest", "valid integer"),
        (None, RANK, "bad_manifest", "valid integer"),
        (0, RANK, "bad_manifest", "greater than or equal to 1"),
        (8, True, "bad_manifest", "field 'rank'"),
    ],
    ids=[
        "int 1e40",
        "float 1e40",
        "over 1e4",
        "scaling 100",
        "NaN",
        "Infinity",
        "bool",
        "string",
        "float",
        "null",
        "zero",
        "rank bool",
    ],
)
def test_an_alpha_outside_its_bound_or_type_is_refused(
    alpha: object, rank: object, reason: str, fragment: str, folder: Path, no_tensor_reads: None
) -> None:
    _edit_manifest(folder, alpha=alpha, rank=rank)
    refusal = _refusal(folder)
    assert refusal.reason == reason and fragment in str(refusal), str(refusal)
    assert MANIFEST_NAME in str(refusal) and ("field 'alpha'" in str(refusal) or "field 'rank'" in str(refusal))
    if reason == "unsafe_scaling":
        assert "set alpha to the lora_alpha" in str(refusal)
    if reason == "unsafe_scaling" and isinstance(alpha, int):
        with pytest.raises(ValueError, match="over the bound|not a finite"):  # a manifest built in code too
            save_adapter(folder.parent / "again", _tensors(), {**FIELDS, "alpha": alpha, "rank": rank}, base=BASE)


def test_alpha_and_scaling_at_their_bounds_load(folder: Path) -> None:
    from rvu_pipelines.adapters.manifest import MAX_ALPHA, MAX_SCALING

    _edit_manifest(folder, alpha=int(MAX_SCALING * RANK))
    assert verify_adapter(folder, BASE).manifest.scaling == MAX_SCALING
    _edit_manifest(folder, alpha=MAX_ALPHA, rank=256)  # the largest alpha, at a rank that keeps the scaling in bound
    assert read_manifest(folder).alpha == MAX_ALPHA


def _resave(folder: Path, tensors: dict[str, torch.Tensor]) -> None:
    """The weights rewritten as given (any dtype), the manifest re-pinned to them."""
    from safetensors.torch import save_file

    save_file(tensors, str(folder / WEIGHTS_NAME))
    _edit_manifest(folder, sha256=sha256_file(folder / WEIGHTS_NAME))


def test_values_that_overflow_float32_are_refused_as_non_finite(folder: Path) -> None:
    """float64 weights of 1e300 are finite as stored and inf in the float32 every runtime loads."""
    _resave(folder, {name: torch.full_like(t, 1e300, dtype=torch.float64) for name, t in _tensors().items()})
    refusal = _refusal(folder)
    assert refusal.reason == "non_finite" and "cast to float32" in str(refusal) and WEIGHTS_NAME in str(refusal)


@pytest.mark.parametrize("value", [1e30, 1e3], ids=["1e30 (inf in the forward pass)", "1e3 (finite, swamps the base)"])
def test_a_scaled_delta_over_its_bound_is_refused(value: float, folder: Path) -> None:
    from rvu_pipelines.adapters.files import MAX_DELTA_NORM

    tensors = _tensors()
    first = sorted(name for name in tensors if ".lora_A." in name)[0]
    tensors[first] = torch.full_like(tensors[first], value)
    tensors[first.replace(".lora_A.", ".lora_B.")] = torch.full_like(tensors[first], value).T.contiguous()
    _resave(folder, tensors)
    refusal = _refusal(folder)
    module = first.removeprefix("base_model.model.").removesuffix(".lora_A.weight")
    assert refusal.reason == "unsafe_delta", str(refusal)
    assert f"module '{module}'" in str(refusal) and f"{MAX_DELTA_NORM:g}" in str(refusal)


def test_a_delta_just_under_its_bound_loads(folder: Path) -> None:
    """A rank-one delta of norm 0.99 x the bound: B @ A = scaling * b a^T, so its norm is scaling * |a| * |b|."""
    from rvu_pipelines.adapters.files import MAX_DELTA_NORM

    tensors = _tensors()
    first = sorted(name for name in tensors if ".lora_A." in name)[0]
    side = (0.99 * MAX_DELTA_NORM / 2.0) ** 0.5  # the fixture's scaling is 2
    a, b = torch.zeros(RANK, HIDDEN), torch.zeros(HIDDEN, RANK)
    a[0, 0], b[0, 0] = side, side
    tensors[first], tensors[first.replace(".lora_A.", ".lora_B.")] = a, b
    _resave(folder, tensors)
    assert torch.equal(verify_adapter(folder, BASE).tensors[first], a)
    b[0, 0] = side * 1.02
    tensors[first.replace(".lora_A.", ".lora_B.")] = b
    _resave(folder, tensors)
    assert _refusal(folder).reason == "unsafe_delta"


@pytest.mark.parametrize("part", ["A", "B"])
def test_a_module_with_one_lora_factor_is_refused(part: str, folder: Path, no_tensor_reads: None) -> None:
    tensors = _tensors()
    dropped = sorted(name for name in tensors if f".lora_{part}." in name)[0]
    del tensors[dropped]
    from safetensors.torch import save_file

    save_file(tensors, str(folder / WEIGHTS_NAME))
    _edit_manifest(folder, sha256=sha256_file(folder / WEIGHTS_NAME))
    refusal = _refusal(folder)
    assert refusal.reason == "corrupted" and f"no lora_{part}" in str(refusal), str(refusal)


@pytest.mark.parametrize(
    ("layers", "reason", "fragment"),
    [
        ([0], "unknown_target_module", "outside the manifest's field 'layers'"),
        ([-1], "bad_manifest", "not layers of tiny-base (0-1)"),
        ([10**30], "bad_manifest", "not layers of tiny-base (0-1)"),
        ([], "bad_manifest", "is an empty list"),
    ],
    ids=["fewer than the weights adapt", "negative", "past the base", "empty"],
)
def test_declared_layers_that_disagree_with_the_weights_or_the_base_are_refused(
    layers: list[int], reason: str, fragment: str, folder: Path, no_tensor_reads: None
) -> None:
    """peft adapts only the declared layers and llama.cpp every tensor: the two runtimes must not disagree."""
    _edit_manifest(folder, layers=layers)
    refusal = _refusal(folder)
    assert refusal.reason == reason and fragment in str(refusal), str(refusal)


def test_declared_layers_that_cover_the_weights_load(folder: Path) -> None:
    _edit_manifest(folder, layers=[1, 0])
    assert verify_adapter(folder, BASE).manifest.layers == [1, 0]


def _outside_copy(folder: Path, name: str) -> Path:
    outside = folder.parent / f"outside-{name}"
    shutil.copyfile(folder / name, outside)
    return outside


def _weights_to_outside(folder: Path) -> None:
    outside = _outside_copy(folder, WEIGHTS_NAME)  # same bytes, so the sha256 would match
    (folder / WEIGHTS_NAME).unlink()
    (folder / WEIGHTS_NAME).symlink_to(outside)


def _weights_to_inside(folder: Path) -> None:
    (folder / WEIGHTS_NAME).rename(folder / "real.safetensors")
    (folder / WEIGHTS_NAME).symlink_to("real.safetensors")


def _manifest_to_outside(folder: Path) -> None:
    outside = _outside_copy(folder, MANIFEST_NAME)
    (folder / MANIFEST_NAME).unlink()
    (folder / MANIFEST_NAME).symlink_to(outside)


def _manifest_dangling(folder: Path) -> None:
    (folder / MANIFEST_NAME).unlink()
    (folder / MANIFEST_NAME).symlink_to(folder.parent / "nowhere.json")


def _other_file_to_outside(folder: Path) -> None:
    (folder / "README.md").symlink_to(_outside_copy(folder, MANIFEST_NAME))


LINKS: dict[str, tuple[Callable[[Path], None], str]] = {
    "weights to a file outside": (_weights_to_outside, WEIGHTS_NAME),
    "weights to a file inside": (_weights_to_inside, WEIGHTS_NAME),
    "manifest to a file outside": (_manifest_to_outside, MANIFEST_NAME),
    "manifest dangling": (_manifest_dangling, MANIFEST_NAME),
    "another file to outside": (_other_file_to_outside, "README.md"),
}


@pytest.mark.parametrize("case", sorted(LINKS))
def test_symbolic_links_in_the_folder_are_refused(case: str, folder: Path, no_tensor_reads: None) -> None:
    make, name = LINKS[case]
    make(folder)
    refusal = _refusal(folder)
    assert refusal.reason == "symlink", str(refusal)
    assert f"{name} (" in str(refusal) and "symbolic link" in str(refusal) and "Copy the file into" in str(refusal)


def test_a_linked_manifest_is_refused_on_its_own_and_a_link_swapped_in_late_at_open(folder: Path) -> None:
    """read_manifest (which the zoo calls without verify_adapter) refuses a link; so does the weights' open
    (O_NOFOLLOW), which is what a link swapped in after the folder scan meets."""
    from rvu_pipelines.adapters.files import _open_regular

    _manifest_to_outside(folder)
    with pytest.raises(AdapterRefused) as manifest:
        read_manifest(folder)
    assert manifest.value.reason == "symlink" and f"{MANIFEST_NAME} (" in str(manifest.value)
    _weights_to_outside(folder)
    with pytest.raises(AdapterRefused) as weights:
        _open_regular(folder / WEIGHTS_NAME)
    assert weights.value.reason == "symlink" and "manifest field 'file'" in str(weights.value)


@pytest.mark.parametrize("name", ["../outside.safetensors", "/tmp/outside.safetensors", "sub/adapter.safetensors"])
def test_a_weights_path_outside_the_folder_is_refused(name: str, folder: Path, no_tensor_reads: None) -> None:
    shutil.copyfile(folder / WEIGHTS_NAME, folder.parent / "outside.safetensors")  # valid bytes, matching sha256
    _edit_manifest(folder, file=name)
    refusal = _refusal(folder)
    assert refusal.reason == "not_safetensors" and "field 'file'" in str(refusal)


# random headers: any JSON value anywhere, with dtype / shape / data_offsets drawn near the valid ones
_LEAF = st.one_of(
    st.none(), st.booleans(), st.integers(-(2**70), 2**70), st.floats(), st.text(max_size=8), st.integers(0, 600)
)
_JSON = st.recursive(
    _LEAF,
    lambda inner: st.lists(inner, max_size=4) | st.dictionaries(st.text(max_size=6), inner, max_size=4),
    max_leaves=20,
)
_COUNT = st.one_of(st.integers(0, 600), st.integers(-3, 2**66), st.booleans(), st.floats(), st.text(max_size=3))
_ENTRY = st.one_of(
    st.fixed_dictionaries(
        {
            "dtype": st.one_of(st.sampled_from(["F32", "F16", "BF16", "F64", "I64", "U8", "BOOL", "f32"]), _JSON),
            "shape": st.one_of(st.lists(_COUNT, max_size=4), st.sampled_from([[RANK, HIDDEN], [HIDDEN, RANK]]), _JSON),
            "data_offsets": st.one_of(st.lists(_COUNT, max_size=3), _JSON),
        }
    ),
    _JSON,
)
_NAMES = st.one_of(
    st.sampled_from(["__metadata__", *sorted(_tensors())]),
    st.text(max_size=10),
)
_HEADER_TEXT = st.one_of(
    st.dictionaries(_NAMES, _ENTRY, max_size=4).map(json.dumps),
    _JSON.map(json.dumps),
    st.integers(1, 5000).map(lambda n: '{"t": ' + "[" * n + "]" * n + "}"),  # past the 1000-frame stack
    st.text(max_size=40),
)


def _valid_header() -> tuple[dict[str, Any], int]:
    """The header of ``_tensors()`` as float32, and its data section's length."""
    header: dict[str, Any] = {"__metadata__": {"format": "pt"}}
    offset = 0
    for name, tensor in sorted(_tensors().items()):
        size = tensor.numel() * 4
        header[name] = {"dtype": "F32", "shape": list(tensor.shape), "data_offsets": [offset, offset + size]}
        offset += size
    return header, offset


VALID_HEADER, DATA_SIZE = _valid_header()


def _one_field_changed(change: tuple[str, str, object]) -> str:
    name, field, value = change
    header = json.loads(json.dumps(VALID_HEADER))
    header[name][field] = value
    return json.dumps(header)


# a valid header with one field of one tensor replaced, over a data section of the right length: these get past
# the JSON and reach the type, tiling and shape checks (and, unchanged, load)
_NEAR_VALID = st.tuples(
    st.sampled_from(sorted(_tensors())),
    st.sampled_from(["dtype", "shape", "data_offsets"]),
    st.one_of(st.lists(_COUNT, max_size=3), st.sampled_from(["F16", "F32", [RANK, HIDDEN], [0, 512]]), _JSON),
).map(_one_field_changed)
_HEADER_AND_DATA = st.one_of(
    st.tuples(_HEADER_TEXT, st.binary(max_size=600)),
    st.tuples(_NEAR_VALID, st.just(bytes(DATA_SIZE))),
    st.tuples(st.just(json.dumps(VALID_HEADER)), st.sampled_from([bytes(DATA_SIZE), b"\xff" * DATA_SIZE])),
)


@pytest.fixture(scope="module")
def scratch(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Path]:
    yield _save(tmp_path_factory.mktemp("hostile") / "adapter")


@settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large])
@given(header_and_data=_HEADER_AND_DATA)
def test_random_headers_are_refused_never_crash(scratch: Path, header_and_data: tuple[str, bytes]) -> None:
    """Whatever the header holds, the parser and verify_adapter answer with a refusal (or a verified adapter for
    a valid header over finite data), never another exception."""
    _write_weights(scratch, *header_and_data)
    try:
        _read_header(scratch / WEIGHTS_NAME)
    except AdapterRefused as exc:
        assert exc.reason == "corrupted"
    try:
        verify_adapter(scratch, BASE)
    except AdapterRefused as exc:
        event(f"verify_adapter: {exc.reason}")
    else:
        event("verify_adapter: verified")


@settings(max_examples=100, deadline=None)
@given(alpha=st.one_of(st.integers(-2, 20_000), _JSON), rank=st.one_of(st.integers(-2, 300), _JSON))
def test_random_alpha_and_rank_are_refused_or_within_the_bound(scratch: Path, alpha: object, rank: object) -> None:
    from rvu_pipelines.adapters.manifest import MAX_ALPHA, MAX_SCALING

    manifest_only = scratch.parent / "manifest-only"
    manifest_only.mkdir(exist_ok=True)
    base_model = {"name": BASE.name, "sha256": BASE.sha256}
    fields = {**FIELDS, "alpha": alpha, "rank": rank, "sha256": "0" * 64, "base_model": base_model}
    (manifest_only / MANIFEST_NAME).write_text(json.dumps(fields))
    try:
        manifest = read_manifest(manifest_only)
    except AdapterRefused as exc:
        assert exc.reason in {"bad_manifest", "unsafe_scaling"}
    else:
        assert 1 <= manifest.alpha <= MAX_ALPHA and manifest.scaling <= MAX_SCALING


def test_saving_an_adapter_replaces_planted_links_instead_of_writing_through_them(tmp_path: Path) -> None:
    """The weights and the manifest are each published in one step: a link planted where either goes is replaced,
    its target left as it was, and the folder verifies."""
    folder = tmp_path / "planted"
    folder.mkdir()
    victims = {name: tmp_path / f"victim-{name}" for name in (WEIGHTS_NAME, MANIFEST_NAME)}
    for name, victim in victims.items():
        victim.write_text("precious")
        (folder / name).symlink_to(victim)
    save_adapter(folder, _tensors(), FIELDS, base=BASE)
    assert all(victim.read_text() == "precious" for victim in victims.values())
    assert not any((folder / name).is_symlink() for name in victims)
    assert verify_adapter(folder, BASE).manifest.sha256 == sha256_file(folder / WEIGHTS_NAME)
    assert sorted(p.name for p in folder.iterdir()) == sorted(victims)  # no temporary file left behind
