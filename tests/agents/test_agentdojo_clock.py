"""AgentDojo's simulated tools stamp e-mails and files with one fixed moment, so an episode replays identically.

With the wall clock, `create_file` / `append_to_file` / `send_email` would write `datetime.now()` into the tool result
the agent reads: prompts (and the tool-use adapter's training digest) would change every run."""

from __future__ import annotations

import datetime
import os
import subprocess
import sys

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


def _new_event_participants(hash_seed: str, ordered: bool) -> str:
    """A new calendar event's participants, created in a fresh interpreter with the given string-hash seed."""
    code = (
        "import datetime as d\n"
        "from agentdojo.default_suites.v1.tools.calendar_client import Calendar\n"
        "from rvu_pipelines.scenarios.agentdojo_clock import install_ordered_participants\n"
        f"if {ordered}: install_ordered_participants()\n"
        "calendar = Calendar(current_day=d.date(2024, 5, 15), account_email='me@x.com', initial_events=[])\n"
        "at = d.datetime(2024, 5, 19, 12)\n"
        "people = ['b@x.com', 'a@x.com', 'b@x.com', 'c@x.com', 'd@x.com']\n"
        "print(','.join(calendar.create_event('lunch', '', at, at, None, people).participants))\n"
    )
    env = {**os.environ, "PYTHONHASHSEED": hash_seed}
    return subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True, check=True).stdout


def test_a_new_events_participants_keep_one_order_whatever_the_hash_seed() -> None:
    seeds = ("1", "2", "3", "4")
    assert len({_new_event_participants(seed, ordered=False) for seed in seeds}) > 1  # AgentDojo's own: a set's order
    ordered = {_new_event_participants(seed, ordered=True).strip() for seed in seeds}
    assert ordered == {"b@x.com,a@x.com,c@x.com,d@x.com,me@x.com"}  # first seen, the account's own address last
