"""``hfer``: the spectral kill switch as an ``InjectionDetector`` (recovery, the memory monitor, the harness).

A text's score is the calibrated switch's probability at its layer and statistic on a named graph
configuration (``config.GRAPH_CONFIGS``, default the sink-free one; one forward pass of the agent's own
weights): ``sigmoid((s − t) / scale)`` with t the switch's threshold, so the default threshold 0.5 is
exactly the switch firing. The switch is calibrated from labelled examples
(:meth:`HferDetector.calibrated`, default 20 drawn from the contamination sets' calibration split: the
seed's claim). A text longer than the model's context raises ``ContextLengthError``: it is never
silently truncated (the caller decides).
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np
import polars as pl

from rvu_pipelines.detectors.base import DetectorBase
from rvu_pipelines.spectral.config import DEFAULT_GRAPH_CONFIG, graph_config
from rvu_pipelines.spectral.graph import STAT_NAMES
from rvu_pipelines.spectral.killswitch import KillSwitch, calibrate, stratified_draw
from rvu_pipelines.spectral.model import SpectralModel

DEFAULT_CALIBRATION_SETS: tuple[str, ...] = ("bipia", "injecagent")
DEFAULT_CALIBRATION_SIZE = 20


class HferDetector(DetectorBase):
    """P(contaminated | text) from one (layer, statistic) of the attention token graph."""

    name = "hfer"

    def __init__(self, model: SpectralModel, switch: KillSwitch, graph: str = DEFAULT_GRAPH_CONFIG) -> None:
        self.model = model
        self.switch = switch
        self.graph = graph
        self.config = graph_config(graph)
        self.version = f"{model.name}:{graph}:L{switch.layer}:{switch.statistic}:t={switch.threshold:.6g}"

    def features(self, text: str) -> np.ndarray:
        """(1, layers, statistics) with only the switch's layer filled (the others are NaN)."""
        layer = self.switch.layer
        stats = self.model.layer_stats(text, layers=[layer], config=self.config)[layer]
        out = np.full((1, self.model.n_layers, len(STAT_NAMES)), np.nan)
        out[0, self.switch.layer] = [getattr(stats, s) for s in STAT_NAMES]
        return out

    def _score(self, texts: list[str]) -> np.ndarray:
        return np.array([float(self.switch.probability(self.features(text))[0]) for text in texts])

    @classmethod
    def calibrated(
        cls,
        model: SpectralModel,
        examples: pl.DataFrame,
        *,
        size: int = DEFAULT_CALIBRATION_SIZE,
        seed: int = 0,
        layers: Sequence[int] | None = None,
        by_source: bool = True,
        graph: str = DEFAULT_GRAPH_CONFIG,
    ) -> HferDetector:
        """Calibrate on ``size`` stratified examples of ``examples``' calibration split (never held-out);
        ``by_source``: each class spread evenly over the sources, so the switch cannot learn the source."""
        pool = examples.filter(pl.col("split") == "calibration")
        strata = pool["source"].to_numpy() if by_source else None
        chosen = stratified_draw(pool["label"].to_numpy(), min(size, pool.height), seed=seed, strata=strata)
        rows = pool[chosen.tolist()]
        values = []
        config = graph_config(graph)
        for text in rows["text"].to_list():
            stats = model.layer_stats(text, layers=layers, config=config)
            row = np.full((model.n_layers, len(STAT_NAMES)), np.nan)
            for layer, s in stats.items():
                row[layer] = [getattr(s, name) for name in STAT_NAMES]
            values.append(row)
        switch = calibrate(np.asarray(values), rows["label"].to_numpy(), layers=layers, seed=seed)
        return cls(model, switch, graph)
