"""The agent's own kill switch for the ``hfer`` defense of the attack table: calibrated once, kept, loaded lazily.

Calibrating seed 004's switch on the tiny profile reads 20 contamination examples through every layer of the
agent's weights (minutes of CPU), and loading those weights into transformers takes seconds. The attack
harness pays neither unless an hfer episode runs, and each at most once per process:

- :class:`SwitchSpec` is everything that decides the calibration: the weights (sha256), the examples (the
  contamination sets, the catalog sha256s of the data they are built from, the draw's size and seed, the
  layers searched) and the code that computes it (sha256 of the spectral modules it runs). Its ``key``
  names the calibration; computing it loads nothing.
- :func:`calibrated_switch` returns the spec's :class:`KillSwitch`: read from ``<spectral cache>/switches/<key>.json``
  (``RVU_SPECTRAL_CACHE``) when an earlier process calibrated it (no model needed), else
  calibrated now on the sets' *calibration* split only (a held-out example is never read) and saved with the
  groups it was drawn from, so a reader can check which examples made the switch.
- The threshold: ``threshold_policy="benign_fpr"`` (default) keeps the layer and statistic the labelled draw
  chose and moves the threshold so that at most ``benign_fpr`` of the deployment's own clean tool outputs fire
  (AgentDojo's ground-truth outputs of the *calibration* user tasks, no injected one: a deployment has its benign
  traffic before it sees an attack); ``"bayes"`` keeps the seed's mixture threshold from the labelled draw alone.
- :class:`LazyHferDetector` is an ``InjectionDetector`` that loads the weights on its first ``score`` and
  whose ``version`` names the weights, the switch (layer, statistic, direction, threshold) and the
  calibration (size, seed, key): what the harness puts in the hfer cells' episode keys.
"""

from __future__ import annotations

import hashlib
import json
import logging
import threading
from collections.abc import Callable, Sequence
from dataclasses import dataclass, replace
from functools import cached_property
from pathlib import Path
from typing import Any

import numpy as np

from rvu_pipelines.atomic_write import write_atomically
from rvu_pipelines.detectors.base import check_threshold
from rvu_pipelines.errors import ConfigError
from rvu_pipelines.paths import spectral_cache_dir
from rvu_pipelines.spectral.config import DEFAULT_GRAPH_CONFIG, graph_config
from rvu_pipelines.spectral.detector import DEFAULT_CALIBRATION_SETS, DEFAULT_CALIBRATION_SIZE, HferDetector
from rvu_pipelines.spectral.errors import SpectralInputError
from rvu_pipelines.spectral.killswitch import MIN_PER_CLASS, KillSwitch, spread_over_strata, stratified_draw
from rvu_pipelines.spectral.model import DEFAULT_N_CTX, SpectralModel, load_spectral_model

logger = logging.getLogger(__name__)

SPECTRAL_DIR = Path(__file__).resolve().parent
# The modules a calibration runs (data sets, forward pass, graph statistics, the switch): an edit to any of them
# names a new calibration, so a kept switch is never one an older version of the code computed.
CALIBRATION_CODE: tuple[str, ...] = (
    "config.py",
    "data.py",
    "detector.py",
    "fast.py",
    "graph.py",
    "killswitch.py",
    "model.py",
    "tool_outputs.py",
    "uncertainty.py",
)
# The catalog data sets ``load_spectral_datasets`` builds the contamination sets from (InjecAgent's clean
# fill takes TOFU answers): their pinned sha256s enter the key.
CATALOG_SETS: tuple[str, ...] = ("bipia", "deepset_prompt_injections", "injecagent", "tofu")
CONTAMINATION_SETS: tuple[str, ...] = ("bipia", "deepset", "injecagent")
SWITCH_FILE_VERSION = 1
THRESHOLD_POLICIES: tuple[str, ...] = ("benign_fpr", "bayes")
DEFAULT_BENIGN_FPR = 0.05
DEFAULT_BENIGN_SIZE = 100

_LOCK = threading.Lock()
_SWITCHES: dict[tuple[str, str], KillSwitch] = {}  # (store folder, key) -> switch, once per process


def _code_hash() -> str:
    digest = hashlib.sha256()
    for name in CALIBRATION_CODE:
        data = (SPECTRAL_DIR / name).read_bytes()
        digest.update(name.encode() + b"\0" + len(data).to_bytes(8, "big") + data)
    return digest.hexdigest()


def _data_hashes() -> dict[str, str]:
    from rvu_pipelines.data import load_catalog

    catalog = load_catalog()
    out = {}
    for name in CATALOG_SETS:
        files = catalog.get(name).file_sha256()  # type: ignore[union-attr]
        out[name] = hashlib.sha256(json.dumps(files, sort_keys=True).encode()).hexdigest()
    return out


@dataclass(frozen=True)
class SwitchSpec:
    """What decides a calibration of the agent's switch (the GGUF llama.cpp runs, read in transformers)."""

    model_path: str
    model_sha256: str
    n_ctx: int = DEFAULT_N_CTX
    sets: tuple[str, ...] = DEFAULT_CALIBRATION_SETS
    size: int = DEFAULT_CALIBRATION_SIZE
    seed: int = 0
    layers: tuple[int, ...] | None = None  # None: every layer is a candidate (the seed's search)
    by_source: bool = True  # each class of the draw spread evenly over the sets
    threshold_policy: str = "benign_fpr"
    graph: str = DEFAULT_GRAPH_CONFIG  # the graph configuration (config.GRAPH_CONFIGS)
    benign_fpr: float = DEFAULT_BENIGN_FPR
    benign_size: int = DEFAULT_BENIGN_SIZE

    def __post_init__(self) -> None:
        object.__setattr__(self, "sets", tuple(self.sets))
        if self.layers is not None:
            object.__setattr__(self, "layers", tuple(int(layer) for layer in self.layers))
        if not self.model_sha256:
            raise ConfigError("SwitchSpec.model_sha256 is empty; the switch's key needs the weights' sha256.")
        unknown = sorted(set(self.sets) - set(CONTAMINATION_SETS))
        if not self.sets or unknown:
            raise ConfigError(
                f"SwitchSpec.sets={self.sets!r} is invalid; allowed values: one or more of "
                f"{', '.join(CONTAMINATION_SETS)}."
            )
        try:
            graph_config(self.graph)
        except SpectralInputError as exc:
            raise ConfigError(f"SwitchSpec.graph={self.graph!r} is invalid: {exc}") from exc
        if self.threshold_policy not in THRESHOLD_POLICIES:
            raise ConfigError(
                f"SwitchSpec.threshold_policy={self.threshold_policy!r} is invalid; allowed values: "
                f"{', '.join(THRESHOLD_POLICIES)}."
            )
        if not 0.0 < float(self.benign_fpr) < 1.0 or int(self.benign_size) < 20:
            raise ConfigError(
                f"SwitchSpec.benign_fpr={self.benign_fpr} / benign_size={self.benign_size} are invalid; the FPR "
                "lies strictly between 0 and 1 and the benign sample holds at least 20 tool outputs."
            )
        if int(self.size) < 2 * MIN_PER_CLASS:
            raise ConfigError(
                f"SwitchSpec.size={self.size} is invalid; the switch needs at least {2 * MIN_PER_CLASS} "
                f"examples ({MIN_PER_CLASS} of each class)."
            )

    @classmethod
    def for_profile(
        cls, profile: str | None = None, *, expected_sha256: str | None = None, **calibration: Any
    ) -> SwitchSpec:
        """The spec for a model profile's LLM (resolved and sha256-verified by the model store).

        ``expected_sha256``: the agent's weights; a profile that resolves to other weights is a ConfigError
        (the switch must read the agent's own weights)."""
        from rvu_pipelines.models import ModelStore, load_model_config

        config = load_model_config()
        resolved = ModelStore().resolve("llm", config.profile(profile)["llm"])
        if expected_sha256 and resolved.sha256 != expected_sha256:
            raise ConfigError(
                f"The hfer switch reads the agent's own weights, but profile '{config.profile_name(profile)}' "
                f"resolves to {resolved.path} (sha256 {resolved.sha256}) while the agent runs {expected_sha256}; "
                "open the harness with the profile of the agent's LLM."
            )
        return cls(str(resolved.path), resolved.sha256, n_ctx=int(resolved.n_ctx), **calibration)

    def identity(self) -> dict[str, Any]:
        """The inputs of the calibration, as hashed into ``key`` (the path is not one: the sha256 is)."""
        return {
            "model_sha256": self.model_sha256,
            "sets": list(self.sets),
            "size": int(self.size),
            "seed": int(self.seed),
            "layers": None if self.layers is None else [int(layer) for layer in self.layers],
            "by_source": bool(self.by_source),
            "graph": self.graph,
            "threshold": (
                {"policy": "benign_fpr", "fpr": float(self.benign_fpr), "size": int(self.benign_size)}
                if self.threshold_policy == "benign_fpr"
                else {"policy": "bayes"}
            ),
            "data": _data_hashes(),
            "code": _code_hash(),
        }

    @cached_property
    def key(self) -> str:
        payload = json.dumps(self.identity(), sort_keys=True)
        return hashlib.sha256(payload.encode()).hexdigest()[:24]

    def load_model(self) -> SpectralModel:
        return load_spectral_model(self.model_path, sha256=self.model_sha256, n_ctx=self.n_ctx)


def switch_folder(store: Path | str | None = None) -> Path:
    """``store``, else the spectral cache's ``switches/``: a switch file is named by the hash of everything that
    made it (weights, data, draw, code), so it is safe to share between state folders and clean clones."""
    return Path(store) if store is not None else spectral_cache_dir() / "switches"


def switch_version(spec: SwitchSpec, switch: KillSwitch) -> str:
    """The weights, the switch and its calibration in one string (the hfer cells' cache key part)."""
    direction = "+" if switch.direction >= 0 else "-"
    return (
        f"hfer:{spec.model_sha256[:16]}:{spec.graph}:L{switch.layer}:{direction}{switch.statistic}:t={switch.threshold:.6g}"
        f":n={switch.n_calibration}:seed={spec.seed}:{spec.key}"
    )


def calibration_examples(spec: SwitchSpec) -> tuple[Any, Any]:
    """(pool, drawn): the sets' calibration split, and the ``size`` stratified rows of it the calibration reads
    (``HferDetector.calibrated`` draws the same rows from the same pool)."""
    import polars as pl

    from rvu_pipelines.spectral.data import load_spectral_datasets

    sets = load_spectral_datasets()
    pool = pl.concat([sets[name] for name in spec.sets]).filter(pl.col("split") == "calibration")
    strata = pool["source"].to_numpy() if spec.by_source else None
    chosen = stratified_draw(
        pool["label"].to_numpy(), min(int(spec.size), pool.height), seed=int(spec.seed), strata=strata
    )
    return pool, pool[chosen.tolist()]


def benign_outputs(spec: SwitchSpec) -> Any:
    """The clean tool outputs of AgentDojo's calibration user tasks, ``benign_size`` of them spread over the
    suites (seeded); none of them is ever evaluated on."""
    import polars as pl

    from rvu_pipelines.spectral.tool_outputs import agentdojo_tool_outputs

    outputs = agentdojo_tool_outputs()
    pool = outputs.filter((pl.col("split") == "calibration") & (pl.col("label") == 0))
    count = min(int(spec.benign_size), pool.height)
    rng = np.random.default_rng(int(spec.seed))
    chosen = spread_over_strata(np.arange(pool.height), pool["source"].to_numpy(), count, rng)
    return pool[np.sort(chosen).tolist()]


def fpr_threshold(detector: HferDetector, texts: Sequence[str], fpr: float) -> tuple[float, int]:
    """The switch's threshold with at most ``floor(fpr * n)`` of ``texts`` firing, and how many were scored
    (a text beyond the model's context is left out: the inline switch cannot score it either)."""
    from rvu_pipelines.detectors.production import threshold_for_fpr
    from rvu_pipelines.spectral.errors import ContextLengthError

    scores = []
    for text in texts:
        try:
            scores.append(float(detector.switch.score(detector.features(text))[0]))
        except ContextLengthError:
            continue
    # a thousandth of the classes' spread above the last benign score it must not flag: the same text re-read
    # with another thread count moves the statistic by float32 noise, which must not make it fire
    return threshold_for_fpr(np.asarray(scores), fpr) + 1e-3 * detector.switch.scale, len(scores)


def _read(path: Path, spec: SwitchSpec) -> KillSwitch | None:
    try:
        document = json.loads(path.read_text(encoding="utf-8"))
        if document.get("key") != spec.key or document.get("identity") != spec.identity():
            logger.warning("The kept switch %s belongs to another calibration; calibrating again.", path)
            return None
        return KillSwitch(**document["switch"])
    except FileNotFoundError:
        return None
    except (OSError, ValueError, TypeError, KeyError) as exc:  # a torn or edited file: calibrate again
        logger.warning("Cannot read the kept switch %s (%s); calibrating again.", path, exc)
        return None


def _calibrate_and_keep(spec: SwitchSpec, path: Path) -> KillSwitch:
    pool, rows = calibration_examples(spec)
    if set(rows["split"].to_list()) != {"calibration"}:  # the filter above makes this impossible; say so if not
        raise ConfigError("The hfer calibration drew a held-out example; it must read the calibration split only.")
    layers = None if spec.layers is None else list(spec.layers)
    detector = HferDetector.calibrated(
        spec.load_model(),
        pool,
        size=int(spec.size),
        seed=int(spec.seed),
        layers=layers,
        by_source=spec.by_source,
        graph=spec.graph,
    )
    switch = detector.switch
    benign: dict[str, Any] = {}
    if spec.threshold_policy == "benign_fpr":
        texts = benign_outputs(spec)
        threshold, scored = fpr_threshold(detector, texts["text"].to_list(), float(spec.benign_fpr))
        benign = {"bayes_threshold": switch.threshold, "n_benign": scored, "groups": texts["group"].to_list()}
        switch = replace(switch, threshold=threshold)
    document = {
        "file_version": SWITCH_FILE_VERSION,
        "key": spec.key,
        "identity": spec.identity(),
        "version": switch_version(spec, switch),
        "switch": switch.as_dict(),
        "examples": [
            {"group": r["group"], "label": int(r["label"]), "source": r["source"], "split": r["split"]}
            for r in rows.select("group", "label", "source", "split").iter_rows(named=True)
        ],
        "benign": benign,
    }
    try:
        write_atomically(path, json.dumps(document, indent=2, sort_keys=True) + "\n", fsync=False)
    except OSError as exc:  # a read-only cache folder only costs the next process the calibration
        logger.warning("Could not keep the calibrated switch in %s: %s", path, exc)
    return switch


def calibrated_switch(spec: SwitchSpec, store: Path | str | None = None) -> KillSwitch:
    """The spec's switch: this process's, else the kept one, else calibrated now (and kept)."""
    folder = switch_folder(store)
    cache_key = (str(folder.resolve()), spec.key)
    with _LOCK:
        if cache_key not in _SWITCHES:
            path = folder / f"{spec.key}.json"
            _SWITCHES[cache_key] = _read(path, spec) or _calibrate_and_keep(spec, path)
        return _SWITCHES[cache_key]


class LazyHferDetector:
    """``hfer`` on the agent's own weights, calibrated and loaded on first use (at most once per process).

    ``spec``: a :class:`SwitchSpec`, or a function returning one (resolved on first use: resolving a
    profile hashes its GGUF). ``store``: where calibrated switches are kept (default the spectral cache's)."""

    name = "hfer"

    def __init__(
        self, spec: SwitchSpec | Callable[[], SwitchSpec], store: Path | str | None = None, *, label: str = ""
    ) -> None:
        self._source = spec
        self.store = None if store is None else Path(store)
        self.label = label or (
            f"{Path(spec.model_path).name}@{spec.model_sha256[:12]}" if isinstance(spec, SwitchSpec) else ""
        )
        self._spec: SwitchSpec | None = spec if isinstance(spec, SwitchSpec) else None
        self._detector: HferDetector | None = None
        self._lock = threading.Lock()

    @classmethod
    def for_profile(
        cls,
        profile: str | None = None,
        *,
        expected_sha256: str | None = None,
        store: Path | str | None = None,
        **calibration: Any,
    ) -> LazyHferDetector:
        """The switch of a model profile's LLM (the default profile when None); nothing is resolved yet."""

        def resolve() -> SwitchSpec:
            return SwitchSpec.for_profile(profile, expected_sha256=expected_sha256, **calibration)

        return cls(resolve, store, label=f"profile {profile or '(default)'}")

    def __repr__(self) -> str:  # stable: no addresses, and never resolves or calibrates
        return f"LazyHferDetector({self.label or 'unresolved'})"

    @property
    def spec(self) -> SwitchSpec:
        with self._lock:
            if self._spec is None:
                source = self._source
                self._spec = source if isinstance(source, SwitchSpec) else source()
            return self._spec

    @property
    def switch(self) -> KillSwitch:
        return calibrated_switch(self.spec, self.store)

    @property
    def version(self) -> str:
        """Weights, layer, direction and statistic, threshold, calibration size, seed and key (reads the kept
        switch, or calibrates: only an hfer cell asks)."""
        return switch_version(self.spec, self.switch)

    def detector(self) -> HferDetector:
        spec, switch = self.spec, self.switch
        with self._lock:
            if self._detector is None:
                self._detector = HferDetector(spec.load_model(), switch, spec.graph)
            return self._detector

    def score(self, texts: Sequence[str]) -> np.ndarray:
        return self.detector().score(texts)

    def predict(self, texts: Sequence[str], threshold: float = 0.5) -> np.ndarray:
        return self.score(texts) >= check_threshold(threshold)

    @property
    def loaded(self) -> bool:
        """Whether the weights were loaded through this detector (building settings must not load them)."""
        return self._detector is not None
