from pathlib import Path

from dagster import ConfigurableResource
from pydantic import Field

from rvu_pipelines.paths import state_dir
from rvu_pipelines.recovery.froc import FrocPolicy
from rvu_pipelines.recovery.inbox import IncidentFolders, incident_folders


class RecoveryResource(ConfigurableResource):
    """Where recovery keeps its state: the provenance store, vector index, signing keys, certificates.

    Defaults live under .rvu/recovery; the incident inbox follows RVU_INCIDENT_DIR (default .rvu/incidents).
    """

    root: str | None = Field(default=None, description="State folder; default .rvu/recovery")
    incident_dir: str | None = Field(default=None, description="Incident folder root; default RVU_INCIDENT_DIR")
    policy_path: str | None = Field(default=None, description="FROC policy YAML; default configs/adapters.yaml")

    def _root(self) -> Path:
        path = Path(self.root) if self.root else state_dir() / "recovery"
        path.mkdir(parents=True, exist_ok=True)
        return path

    @property
    def store_path(self) -> Path:
        return self._root() / "provenance.duckdb"

    @property
    def index_path(self) -> Path:
        return self._root() / "index.faiss"

    @property
    def key_dir(self) -> Path:
        return self._root() / "keys"

    def certificate_path(self, incident_id: str) -> Path:
        folder = self._root() / "certificates"
        folder.mkdir(parents=True, exist_ok=True)
        return folder / f"{incident_id}.json"

    def folders(self) -> IncidentFolders:
        return incident_folders(self.incident_dir)

    def policy(self) -> FrocPolicy:
        return FrocPolicy.load(self.policy_path)
