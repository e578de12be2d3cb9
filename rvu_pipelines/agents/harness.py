"""The attack harness: one object that owns the cached LLM, the defense settings and the results
folder, and runs cells of the attack table (benchmark × attack × defense). Dagster assets, the nightly
schedule and ``rvu regress`` all go through it, so a cell computed by one is reused by the others (rows of
the same code version; the nightly sweep and ``rvu regress`` re-run every episode, see
``run_cell(rerun=True)``).
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

import numpy as np

from rvu_pipelines.agents.evaluation import CellRun, CellSpec, CellWork, plan_cell, run_cells
from rvu_pipelines.agents.llm_cache import CachedChatModel, ResponseCache
from rvu_pipelines.attacks.catalog import AttackContext, GateCheck, attack_fingerprint, attacked, get_attack
from rvu_pipelines.detectors import InjectionDetector
from rvu_pipelines.detectors.base import MemoizedDetector
from rvu_pipelines.detectors.catalog import PRODUCTION_CHOICE, by_name, plugin_for
from rvu_pipelines.errors import ConfigError
from rvu_pipelines.models.llm import (
    AdapterHostingModel,
    ChatCompletion,
    ChatModel,
    Message,
    adapter_files_of,
    adapter_key_of,
)
from rvu_pipelines.paths import config_dir, state_dir
from rvu_pipelines.scenarios import Scenario, scenarios_for
from rvu_pipelines.scenarios.axes import NATIVE

if TYPE_CHECKING:  # annotations only: the defenses import AgentDojo (seconds), the code location imports this
    from rvu_pipelines.agents.defenses import DefenseSettings

AGENT_N_CTX = 8192  # SmolLM2 and Qwen2.5 both take 8k; AgentDojo tool schemas need more than a 2k smoke context


class LazyDetector:
    """A detector loaded on its first ``score``: a cell whose episodes are all saved never loads it."""

    def __init__(self, choice: str, name: str, tracking_uri: str | None = None) -> None:
        self.choice = choice
        self.name = name
        self.tracking_uri = tracking_uri
        self._detector: InjectionDetector | None = None

    def score(self, texts: Sequence[str]) -> np.ndarray:
        if self._detector is None:
            self._detector, _ = by_name(self.choice, self.tracking_uri)
        return self._detector.score(texts)

    def predict(self, texts: Sequence[str], threshold: float = 0.5) -> np.ndarray:
        return self.score(texts) >= threshold


class LazyChatModel:
    """A chat model built on its first call: with every answer in the response cache it is never built."""

    def __init__(self, factory: Callable[[], ChatModel], name: str) -> None:
        self._factory = factory
        self._model: ChatModel | None = None
        self.name = name

    def _built(self) -> ChatModel:
        if self._model is None:
            self._model = self._factory()
        return self._model

    def chat(self, messages: list[Message], **kwargs: Any) -> ChatCompletion:
        return self._built().chat(messages, **kwargs)

    # adapters: loading one builds the model (its weights must be open); the key of an unbuilt model is ""

    def load_adapter(self, adapter_id: str, gguf_path: Path | str, scale: float = 1.0) -> Any:
        model = self._built()
        if not isinstance(model, AdapterHostingModel):
            raise ConfigError(f"The chat model {self.name!r} ({type(model).__name__}) cannot load LoRA adapters.")
        return model.load_adapter(adapter_id, gguf_path, scale)

    def unload_adapter(self, adapter_id: str) -> None:
        model = self._built()
        if not isinstance(model, AdapterHostingModel):
            raise KeyError(f"No adapter {adapter_id!r} is loaded (loaded: none).")
        model.unload_adapter(adapter_id)

    def adapter_key(self) -> str:
        return "" if self._model is None else adapter_key_of(self._model)

    def active_adapters(self) -> list[str]:
        return list(self._model.active_adapters()) if isinstance(self._model, AdapterHostingModel) else []

    def adapter_files(self) -> list[str]:
        return [] if self._model is None else adapter_files_of(self._model)


def detector_for(choice: str, tracking_uri: str | None = None) -> tuple[InjectionDetector, str]:
    """The classifier defense's detector and its version string (see :mod:`rvu_pipelines.detectors.catalog`),
    loading nothing heavy up front where the version is known without the weights.

    ``tracking_uri``: the MLflow registry registered detectors come from (the tracker resource's, resolved at
    the edge); None uses the platform default."""
    plugin, _ = plugin_for(choice)
    if plugin.version is not None:
        return LazyDetector(choice, plugin.display_name or plugin.name, tracking_uri), plugin.version()
    return by_name(choice, tracking_uri)


def version_of(detector: object) -> str:
    """A detector's ``version`` (an HferDetector's names its weights and switch), else ``name:<name>``."""
    version_attr = getattr(detector, "version", None)
    if version_attr:
        return str(version_attr)
    return f"name:{getattr(detector, 'name', type(detector).__name__)}"


@dataclass
class Harness:
    """Cached LLM + defense settings + results root for one model profile."""

    profile: str
    llm: CachedChatModel
    model_id: str  # sha256 of the model weights (cache and episode keys)
    settings: DefenseSettings
    detector_version: str
    root: Path
    gguf_path: Path | None = None  # the agent's weights, for attacks that read the model (its chat template)
    strings_dir: Path | None = None  # optimised attack strings; default configs/attacks

    @classmethod
    def open(
        cls,
        chat_model: ChatModel | tuple[Callable[[], ChatModel], str],
        *,
        profile: str,
        model_id: str,
        detector: str = PRODUCTION_CHOICE,
        tracking_uri: str | None = None,
        root: Path | None = None,
        cache_path: Path | None = None,
        max_iters: int | None = None,
        max_tokens: int | None = None,
        gguf_path: Path | None = None,
        strings_dir: Path | None = None,
        **settings: Any,
    ) -> Harness:
        """``chat_model``: a ChatModel, or ``(factory, name)`` to build it only when a prompt misses the cache.

        ``detector``: the classifier defense's detector (default: the calibrated production detector, read from
        ``tracking_uri``'s registry); ``max_iters`` / ``max_tokens``: None keeps DefenseSettings' default;
        ``gguf_path``: the agent's weights, handed to attacks that read the model; ``strings_dir``: where optimised
        attack strings are read (default configs/attacks); ``settings``: other
        DefenseSettings.
        """
        from rvu_pipelines.agents.defenses import DefenseSettings  # runtime only: imports AgentDojo (seconds)

        if isinstance(chat_model, tuple):
            chat_model = LazyChatModel(*chat_model)
        root = Path(root) if root else state_dir() / "attacks"
        cache = ResponseCache(cache_path or state_dir() / "llm_cache.sqlite")
        detector_obj, detector_version = detector_for(detector, tracking_uri)
        limits: dict[str, Any] = {
            k: v for k, v in (("max_iters", max_iters), ("max_tokens", max_tokens)) if v is not None
        }
        if "hfer_detector" not in settings:  # the switch on the agent's own weights; nothing loads until hfer runs
            from rvu_pipelines.spectral.agent_switch import LazyHferDetector

            settings["hfer_detector"] = LazyHferDetector.for_profile(profile, expected_sha256=model_id)
        defense_settings = DefenseSettings(detector=MemoizedDetector(detector_obj), **limits, **settings)
        return cls(
            profile=profile,
            llm=CachedChatModel(chat_model, cache, model_id),
            model_id=model_id,
            settings=defense_settings,
            detector_version=detector_version,
            root=root,
            gguf_path=Path(gguf_path) if gguf_path else None,
            strings_dir=Path(strings_dir) if strings_dir else None,
        )

    def hfer_version(self) -> str:
        """The hfer switch's version (weights sha256, layer, statistic, threshold, calibration size, seed and
        key): read from the kept calibration, or calibrated now; only hfer cells ask for it."""
        return version_of(self.settings.hfer_detector)

    def settings_fingerprint(self, defense: str | None = None) -> str:
        """Every setting that changes an episode's outcome, hashed (the detector by name + version).

        The hfer settings change only hfer episodes: they enter the fingerprint of ``defense="hfer"``
        (the switch's version and firing threshold), so the other cells' keys stay as they were. A LoRA adapter
        loaded into the agent's model (``llm.load_adapter``) enters every cell's fingerprint."""
        fields = {
            k: v
            for k, v in sorted(vars(self.settings).items())
            if k not in ("detector", "fath_key") and not k.startswith("hfer_")
        }
        if defense == "hfer":
            fields["hfer"] = {"detector": self.hfer_version(), "threshold": float(self.settings.hfer_threshold)}
        adapters = self.llm.adapter_key()  # a loaded LoRA changes every episode; "" keeps the base model's keys
        if adapters:
            fields["adapters"] = adapters
        payload = json.dumps({"detector": self.detector_version, **fields}, sort_keys=True, default=str)
        return hashlib.sha256(payload.encode()).hexdigest()[:16]

    def attack_context(self, defense: str) -> AttackContext:
        """What an attack may know in a cell of ``defense``: the agent's model and where optimised strings are."""
        return AttackContext(
            profile=self.profile,
            model_sha256=self.model_id,
            defense=defense,
            strings_dir=self.strings_dir or config_dir() / "attacks",
            gguf_path=self.gguf_path,
            gate_check=self.gate_check(),
        )

    def gate_check(self) -> GateCheck:
        """The tool gate's decision under this harness's settings: ``(defense, scenario, tools) -> all pass``."""
        from rvu_pipelines.agents.defenses.builder import gate_check  # runtime only: imports AgentDojo

        return gate_check(self.settings.allowlist, self.settings.rvg_policies)

    def plan_cell(
        self,
        benchmark: str,
        defense: str,
        *,
        attack: str = NATIVE,
        limit: int | None = None,
        scenarios: Sequence[Scenario] | None = None,
        rerun: bool = False,
    ) -> CellWork:
        """One cell's plan for ``run_cells``; ``scenarios`` (default: the benchmark's fixed-seed sample) are the
        benchmark's own and are rewritten here by ``attack`` (a ``ConfigError`` when the attack cannot rewrite
        one). ``rerun=True`` plans every episode again, otherwise rows stored by the same code version are
        reused."""
        from rvu_pipelines.agents.episode import run_episode  # runtime only: imports AgentDojo (seconds)

        get_attack(attack, field="attack")  # an unknown name fails before any scenario loads
        spec = CellSpec(benchmark=benchmark, defense=defense, profile=self.profile, limit=limit, attack=attack)
        context = self.attack_context(defense)
        native = list(scenarios) if scenarios is not None else scenarios_for(benchmark, limit)
        chosen = [attacked(scenario, attack, context) for scenario in native]

        def episode(scenario: Scenario, workdir: Path) -> dict[str, Any]:
            return run_episode(scenario, defense, self.llm, self.settings, workdir).to_row()

        return plan_cell(
            spec,
            chosen,
            episode,
            model_id=self.model_id,
            settings_fingerprint=self.settings_fingerprint(defense),
            root=self.root,
            rerun=rerun,
            attack_fingerprint=attack_fingerprint(attack, context),
        )

    def run_cells(self, works: Sequence[CellWork], *, progress: bool = True) -> list[CellRun]:
        """The planned cells, scenario by scenario (``evaluation.run_cells``: a scenario's episodes share their
        prompt prefix), one ``CellRun`` per work in the order given."""
        return run_cells(works, llm=self.llm, model_id=self.model_id, progress=progress)

    def run_cell(
        self,
        benchmark: str,
        defense: str,
        *,
        attack: str = NATIVE,
        limit: int | None = None,
        progress: bool = True,
        scenarios: Sequence[Scenario] | None = None,
        rerun: bool = False,
    ) -> CellRun:
        """One cell; ``scenarios`` (default: the benchmark's fixed-seed sample) are the benchmark's own and are
        rewritten here by ``attack``. ``rerun=True`` re-runs every episode against the current code (the
        nightly sweep and ``rvu regress``), otherwise rows stored by the same code version are reused."""
        work = self.plan_cell(benchmark, defense, attack=attack, limit=limit, scenarios=scenarios, rerun=rerun)
        return self.run_cells([work], progress=progress)[0]

    def run_table(
        self,
        benchmark: str,
        defenses: Sequence[str],
        *,
        limit: int | None = None,
        progress: bool = True,
        rerun: bool = False,
        scenarios: Sequence[Scenario] | None = None,
        attack: str = NATIVE,
    ) -> list[CellRun]:
        """Every defense under ``attack`` on the same scenarios (loaded once, unless given)."""
        get_attack(attack, field="attack")
        chosen = list(scenarios) if scenarios is not None else scenarios_for(benchmark, limit)
        works = [
            self.plan_cell(benchmark, d, attack=attack, limit=limit, scenarios=chosen, rerun=rerun) for d in defenses
        ]
        return self.run_cells(works, progress=progress)
