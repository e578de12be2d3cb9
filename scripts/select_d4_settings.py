"""How D4's learning rates and trainable layers were chosen: on a validation split carved from deepset's
*training* split (stratified 20%, seed 42). The test split is never read.

Usage: ``python scripts/select_d4_settings.py '{"head_learning_rate": 1e-3}' '{"trainable_layers": 2}' ...``
(each argument: overrides of ``settings_for("deepset")``; none = the current defaults). Prints validation
F1/AUROC of D4 and of the 0.4/0.6 ensemble with D2 trained on the same 80%.
"""

from __future__ import annotations

import json
import os
import sys

os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")


def main(specs: list[str]) -> int:
    import numpy as np
    import torch
    from sklearn.model_selection import train_test_split

    from rvu_pipelines.detectors import TfidfDetector, finetune, load_corpora, point_metrics, settings_for

    torch.set_num_threads(2)
    corpus = load_corpora(["deepset"])["deepset"]
    texts, labels = corpus.texts("train"), corpus.labels("train")
    fit, val = train_test_split(np.arange(len(labels)), test_size=0.2, stratify=labels, random_state=42)
    fit_texts, val_texts = [texts[i] for i in fit], [texts[i] for i in val]
    d2 = TfidfDetector.train(fit_texts, labels[fit]).score(val_texts)
    print(f"D2 validation: {point_metrics(labels[val], d2)}")
    for spec in specs or ["{}"]:
        overrides = json.loads(spec)
        detector, report = finetune(
            fit_texts, labels[fit], settings=settings_for("deepset", **overrides), progress=False
        )
        d4 = detector.score(val_texts)
        m4, m5 = point_metrics(labels[val], d4), point_metrics(labels[val], 0.4 * d2 + 0.6 * d4)
        print(
            f"{overrides}: {report.wall_seconds:.0f}s  D4 F1 {m4['f1']:.4f} AUROC {m4['auroc']:.4f} | "
            f"D5 F1 {m5['f1']:.4f} AUROC {m5['auroc']:.4f}",
            flush=True,
        )
    return 0


if __name__ == "__main__":
    raise SystemExit(main(sys.argv[1:]))
