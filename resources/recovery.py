from pathlib import Path

from dagster import ConfigurableResource
from pydantic import Field

from rvu_pipelines.recovery.froc import FrocPolicy
from rvu_pipelines.recovery.inbox import IncidentFolders, incident_folders
from rvu_pipelines.recovery.state import RecoveryPaths


class RecoveryResource(ConfigurableResource):
    """Where recovery keeps its state: the provenance store, vector index, signing keys, certificates.

    Defaults live under .rvu/recovery; the incident inbox follows RVU_INCIDENT_DIR (default .rvu/incidents).
    """

    root: str | None = Field(default=None, description="State folder; default .rvu/recovery")
    incident_dir: str | None = Field(default=None, description="Incident folder root; default RVU_INCIDENT_DIR")
    policy_path: str | None = Field(default=None, description="FROC policy YAML; default configs/adapters.yaml")
    detector: str = Field(
        default="exfiltration",
        description="Contamination signal on action records: exfiltration (the exfiltration heuristic), production "
        "(the calibrated injection detector, rvu-injection-detector@production), nanoguard, heuristic or "
        "registered:<name>[@<alias>]; registered ones are read from the MLflow tracker's registry.",
    )

    membership_probe: bool = Field(
        default=True,
        description="Measure every adapter a recovery evicts (members vs non-members from its manifest, loaded vs "
        "evicted) into the certificate's membership_probe section; off, the section says 'not run' and why.",
    )

    def paths(self) -> RecoveryPaths:
        return RecoveryPaths.default(self.root)

    @property
    def store_path(self) -> Path | str:
        return self.paths().store

    @property
    def index_path(self) -> Path:
        return self.paths().index

    @property
    def key_dir(self) -> Path:
        return self.paths().keys

    def certificate_path(self, incident_id: str) -> Path:
        return self.paths().certificate(incident_id)

    def folders(self) -> IncidentFolders:
        return incident_folders(self.incident_dir)

    def policy(self) -> FrocPolicy:
        return FrocPolicy.load(self.policy_path)
