"""MLflow tracking: one run per piece of work that produces metrics, tagged so it can be found again.

The default store is local (SQLite backend + artifact folder under the project's state folder); any
tracking URI (an MLflow server) can replace it. Runs are opened and closed explicitly by the caller,
never by an end-of-job hook, so a run holds exactly the metrics of the work it names.
"""

from __future__ import annotations

import math
import re
import subprocess
from collections.abc import Iterator, Mapping
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from rvu_pipelines.code_version import code_version
from rvu_pipelines.paths import default_tracking_uri, project_root, state_dir

DEFAULT_EXPERIMENT = "rvu"
EXPERIMENT_PREFIX = "rvu-"

# One MLflow experiment per domain, so "compare runs" compares like with like. Keys are the Dagster
# asset groups (and CLI domains); a group not listed lands in DEFAULT_EXPERIMENT.
DOMAIN_EXPERIMENTS: dict[str, str] = {
    "datasets": "rvu-data-models",
    "models": "rvu-data-models",
    "recovery": "rvu-recovery",
    "recovery_reproductions": "rvu-recovery",
    "memory": "rvu-memory",
    "detectors": "rvu-detectors",
    "detector_validity": "rvu-detector-validity",
    "attacks": "rvu-attacks",
    "memory_poisoning": "rvu-memory-poisoning",
    "spectral": "rvu-spectral",
    "spectral_study": "rvu-spectral",
    "adapters": "rvu-adapters",
    "adapter_study": "rvu-adapters",
}


def experiment_for(domain: str | None) -> str:
    """The MLflow experiment a domain's runs go to (asset group name or CLI domain)."""
    return DOMAIN_EXPERIMENTS.get(domain or "", DEFAULT_EXPERIMENT)


def metric_name(key: str) -> str:
    """An MLflow-valid metric name: runs of other characters (e.g. "MEMSAD (k=2)") become one underscore."""
    return re.sub(r"[^A-Za-z0-9_.\-/:]+", "_", key).strip("_")


def numeric_metrics(report: Mapping[str, Any], prefix: str = "") -> dict[str, float]:
    """The finite numbers of a nested report (mappings only; lists are tables, logged as artifacts), named by
    their path: ``{"bipia/text": {"token_count_auroc": {"value": 0.6}}}`` -> ``bipia/text_token_count_auroc_value``."""
    found: dict[str, float] = {}
    for key, value in sorted(report.items(), key=lambda item: str(item[0])):
        name = f"{prefix}_{key}" if prefix else str(key)
        if isinstance(value, Mapping):
            found |= numeric_metrics(value, name)
        elif isinstance(value, int | float) and not isinstance(value, bool) and math.isfinite(value):
            found[metric_name(name)] = float(value)
    return found


def default_artifact_root() -> Path:
    return state_dir() / "mlartifacts"


def git_commit(root: Path | None = None) -> str:
    """The checkout's commit (with '-dirty' if it has uncommitted changes), or 'unknown'."""
    cwd = root or project_root()
    try:
        commit = subprocess.run(
            ["git", "rev-parse", "HEAD"], cwd=cwd, capture_output=True, text=True, timeout=10, check=True
        ).stdout.strip()
        dirty = subprocess.run(
            ["git", "status", "--porcelain", "--untracked-files=no"],
            cwd=cwd,
            capture_output=True,
            text=True,
            timeout=10,
        ).stdout.strip()
    except (OSError, subprocess.SubprocessError):
        return "unknown"
    return f"{commit}-dirty" if dirty else commit


@dataclass
class TrackedRun:
    """A thin handle over an active MLflow run."""

    run_id: str
    experiment_id: str
    _client: Any

    def log_params(self, params: Mapping[str, object]) -> None:
        for key, value in sorted(params.items()):
            self._client.log_param(self.run_id, key, str(value)[:6000])

    def log_metrics(self, metrics: Mapping[str, float], step: int | None = None) -> None:
        for key, value in sorted(metrics.items()):
            self._client.log_metric(self.run_id, key, float(value), step=step or 0)

    def log_artifact(self, path: Path, artifact_path: str | None = None) -> None:
        self._client.log_artifact(self.run_id, str(path), artifact_path)

    def set_tags(self, tags: Mapping[str, object]) -> None:
        for key, value in sorted(tags.items()):
            self._client.set_tag(self.run_id, key, str(value))


class MlflowTracker:
    """Opens tagged MLflow runs against a tracking URI (local SQLite by default)."""

    def __init__(
        self, tracking_uri: str | None = None, experiment: str = DEFAULT_EXPERIMENT, artifact_root: Path | None = None
    ) -> None:
        self.tracking_uri = tracking_uri or default_tracking_uri()
        self.experiment = experiment
        self.artifact_root = Path(artifact_root) if artifact_root else default_artifact_root()

    def _client(self) -> Any:
        from mlflow.tracking import MlflowClient

        return MlflowClient(tracking_uri=self.tracking_uri)

    def experiment_id(self) -> str:
        """The experiment's id, created on first use. Several step processes or celery workers may create it at
        once (a fresh tracking server, three steps starting together): the losers of that race get the winner's."""
        from mlflow.exceptions import MlflowException

        client = self._client()
        found = client.get_experiment_by_name(self.experiment)
        if found is not None:
            return found.experiment_id
        location = None
        if "://" not in self.tracking_uri or self.tracking_uri.startswith("sqlite:"):
            self.artifact_root.mkdir(parents=True, exist_ok=True)
            location = (self.artifact_root / self.experiment).resolve().as_uri()
        try:
            return client.create_experiment(self.experiment, artifact_location=location)
        except MlflowException as exc:
            if exc.error_code != "RESOURCE_ALREADY_EXISTS":
                raise
            found = client.get_experiment_by_name(self.experiment)
            if found is None:
                raise
            return found.experiment_id

    @contextmanager
    def run(
        self, name: str, *, tags: Mapping[str, object] | None = None, params: Mapping[str, object] | None = None
    ) -> Iterator[TrackedRun]:
        """A run that ends FINISHED when the block completes and FAILED if it raises; tagged with the
        checkout's ``git_commit`` and the ``code_version`` that episode rows and cells record too."""
        client = self._client()
        all_tags = {"git_commit": git_commit(), "code_version": code_version(), **(tags or {})}
        created = client.create_run(
            self.experiment_id(), run_name=name, tags={k: str(v) for k, v in sorted(all_tags.items())}
        )
        run = TrackedRun(created.info.run_id, created.info.experiment_id, client)
        if params:
            run.log_params(params)
        try:
            yield run
        except BaseException:
            client.set_terminated(run.run_id, status="FAILED")
            raise
        client.set_terminated(run.run_id, status="FINISHED")

    def project_experiments(self) -> list[Any]:
        """Every experiment of this platform in the store (the per-domain ones and the default)."""
        client = self._client()
        found = client.search_experiments(max_results=1000)
        return sorted(
            (e for e in found if e.name == DEFAULT_EXPERIMENT or e.name.startswith(EXPERIMENT_PREFIX)),
            key=lambda e: e.name,
        )

    def latest_project_runs(self, max_results: int = 50) -> list[Any]:
        """The newest runs across all of the platform's experiments, newest first."""
        ids = [e.experiment_id for e in self.project_experiments()]
        if not ids:
            return []
        return list(self._client().search_runs(ids, order_by=["attributes.start_time DESC"], max_results=max_results))

    def latest_runs(self, max_results: int = 20, filter_string: str = "") -> list[Any]:
        client = self._client()
        found = client.get_experiment_by_name(self.experiment)
        if found is None:
            return []
        return list(
            client.search_runs(
                [found.experiment_id],
                filter_string=filter_string,
                order_by=["attributes.start_time DESC"],
                max_results=max_results,
            )
        )
