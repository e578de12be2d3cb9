"""Shared detector fixtures: the real corpora, the package-shipped encoder, and small trained D2/D4.

D4 is fine-tuned once per session on a stratified 32-text subsample of deepset's training split for
one epoch (seconds); the full-corpus runs are marked slow or live in the evaluation assets.
"""

from __future__ import annotations

import pytest

from rvu_pipelines.detectors import Corpus, FinetunedDetector, FinetuneSettings, TfidfDetector, finetune, load_corpora
from rvu_pipelines.detectors.corpora import stratified_subsample
from rvu_pipelines.detectors.finetune import EncoderRef, resolve_encoder

TINY_D4 = FinetuneSettings(epochs=1, max_length=64)
TINY_TRAIN = 32


@pytest.fixture(scope="session")
def corpora(shared_data) -> dict[str, Corpus]:
    return load_corpora()


@pytest.fixture(scope="session")
def deepset(corpora) -> Corpus:
    return corpora["deepset"]


@pytest.fixture(scope="session")
def encoder() -> EncoderRef:
    return resolve_encoder("tiny")


@pytest.fixture(scope="session")
def tiny_train(deepset):
    part = stratified_subsample(deepset.part("train"), TINY_TRAIN)
    return part["text"].to_list(), part["label"].to_numpy()


@pytest.fixture(scope="session")
def tiny_settings() -> FinetuneSettings:
    return TINY_D4


@pytest.fixture(scope="session")
def tiny_d4(tiny_train, encoder) -> tuple[FinetunedDetector, object]:
    texts, labels = tiny_train
    return finetune(texts, labels, encoder=encoder, settings=TINY_D4, progress=False)


@pytest.fixture(scope="session")
def d2_deepset(deepset) -> TfidfDetector:
    return TfidfDetector.train(deepset.texts("train"), deepset.labels("train"))


@pytest.fixture(scope="session")
def tiny_d2(tiny_train) -> TfidfDetector:
    """D2 on the 32-text subsample: a small vocabulary, so skops saves and loads it in well under a second."""
    texts, labels = tiny_train
    return TfidfDetector.train(texts, labels)


@pytest.fixture
def tiny_hub_classifier(tmp_path, encoder):
    """A tiny randomly initialised BERT sequence classifier (labels SAFE / INJECTION) saved in a local folder, with
    the encoder's tokenizer: the hub classifier's code path without the hub."""
    import torch
    from transformers import AutoTokenizer, BertConfig, BertForSequenceClassification

    torch.manual_seed(0)
    config = BertConfig(
        vocab_size=30522,
        hidden_size=32,
        num_hidden_layers=1,
        num_attention_heads=2,
        intermediate_size=37,
        id2label={0: "SAFE", 1: "INJECTION"},
        label2id={"SAFE": 0, "INJECTION": 1},
    )
    BertForSequenceClassification(config).save_pretrained(tmp_path)
    AutoTokenizer.from_pretrained(str(encoder.path)).save_pretrained(tmp_path)
    return tmp_path
