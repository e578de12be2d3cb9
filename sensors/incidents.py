"""Start recovery when an incident log lands in the inbox: one run per distinct file content."""

from dagster import (
    DefaultSensorStatus,
    RunRequest,
    SensorEvaluationContext,
    SensorResult,
    sensor,
)

from assets.recovery import INCIDENTS, incident_partitions, recovery_job
from resources.recovery import RecoveryResource
from rvu_pipelines.recovery.inbox import triage_inbox


@sensor(
    job=recovery_job,
    minimum_interval_seconds=15,
    default_status=DefaultSensorStatus.RUNNING,
    description="Watches the incident inbox (RVU_INCIDENT_DIR/inbox): valid logs become `incidents` partitions "
    "and start recovery, keyed by content sha256 so the same file twice starts one run; malformed logs move to "
    "dead_letter/ with an .error.json report beside them.",
)
def incident_log_sensor(context: SensorEvaluationContext, recovery: RecoveryResource) -> SensorResult:
    folders = recovery.folders()
    for outcome in triage_inbox(folders):
        if outcome.error:
            context.log.warning(f"dead-lettered {outcome.source}: {outcome.error.splitlines()[0]}")
    accepted = folders.accepted_incidents()
    known = set(context.instance.get_dynamic_partitions(INCIDENTS))
    new = [incident_id for incident_id, _ in accepted if incident_id not in known]
    # every accepted log is requested each tick; Dagster drops run keys it has seen, so a crash
    # between accepting a file and requesting its run loses nothing
    return SensorResult(
        run_requests=[RunRequest(run_key=sha256, partition_key=incident_id) for incident_id, sha256 in accepted],
        dynamic_partitions_requests=[incident_partitions.build_add_request(new)] if new else [],
    )
