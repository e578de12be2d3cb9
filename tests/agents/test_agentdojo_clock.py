"""AgentDojo's simulated tools stamp e-mails and files with one fixed moment, so an episode replays identically.

With the wall clock, `create_file` / `append_to_file` / `send_email` would write `datetime.now()` into the tool result
the agent reads: prompts (and the tool-use adapter's training digest) would change every run."""

from __future__ import annotations

import datetime

import pytest
from agentdojo.agent_pipeline.ground_truth_pipeline import GroundTruthPipeline

from rvu_pipelines.adapters.tool_traces import agentdojo_traces
from rvu_pipelines.adapters.zoo_data import TrainingSet
from rvu_pipelines.scenarios.agentdojo_clock import AGENTDOJO_NOW, install_fixed_clock
from rvu_pipelines.scenarios.agentdojo_tasks import suites

VERSION = "v1.2.2"  # configs/benchmarks.yaml


@pytest.fixture(scope="module")
def workspace() -> object:
    return suites(VERSION)["workspace"]


def test_tools_stamp_the_fixed_moment(workspace) -> None:
    env = workspace.load_and_inject_default_environment({})
    created = env.cloud_drive.create_file("notes.txt", "hello")
    assert created.last_modified == AGENTDOJO_NOW
    appended = env.cloud_drive.append_to_file(created.id_, " world")
    assert appended.last_modified == AGENTDOJO_NOW
    sent = env.inbox.send_email(["a@example.com"], "subject", "body")
    assert sent.timestamp == AGENTDOJO_NOW
    assert install_fixed_clock() == []  # idempotent: already installed by suites()
    assert datetime.datetime.now() > AGENTDOJO_NOW  # the rest of the process keeps the real clock


def test_the_moment_is_after_the_data_so_the_suites_own_checks_still_pass(workspace) -> None:
    """AgentDojo's utility checks compare a new stamp with the data's ("last_modified increased"): every workspace
    user task's ground truth must still solve its task. (Injection tasks read no stamp; `TaskSuite.check()` of
    v1.2.2 reports the same results with and without the clock: injection tasks 6-13 fail it upstream.)"""
    env = workspace.load_and_inject_default_environment({})
    stamps = [f.last_modified for f in env.cloud_drive.files.values()]
    stamps += [e.timestamp for e in env.inbox.emails.values()]
    assert max(stamps) < AGENTDOJO_NOW  # a "new" stamp is newer than anything in the data, as with a wall clock
    failed = []
    for task_id, task in sorted(workspace.user_tasks.items()):
        utility, _ = workspace.run_task_with_pipeline(GroundTruthPipeline(task), task, None, {})
        if not utility:
            failed.append(task_id)
    assert failed == []


def test_tool_traces_are_the_same_on_every_build() -> None:
    """The tool-use adapter's training data: its digest is the zoo's reuse key, so it must not move with time."""
    first, second = agentdojo_traces(["workspace"]), agentdojo_traces(["workspace"])
    stamped = [e for e in first if AGENTDOJO_NOW.isoformat(sep=" ") in e.prompt]
    assert stamped, "no workspace trace shows a created / appended file: the check below would be vacuous"
    assert TrainingSet(first, "d", "s").sha256 == TrainingSet(second, "d", "s").sha256
