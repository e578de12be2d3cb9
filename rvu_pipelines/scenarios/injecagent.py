"""InjecAgent (base setting) scenarios: 510 direct-harm (dh) and 544 data-stealing (ds) test cases.

Each case becomes a runtime with the case's user tool and its attacker tool(s), specified from
InjecAgent's ``tools.json``. The user tool returns the case's ``tool_response`` (the attacker
instruction sits inside it); attacker tools return a fixed, plausible result -- for ds, stage 1 returns
synthetic "stolen" data so that stage 2 (sending it on) can happen.

Deviation from InjecAgent: it pre-fills the user tool's call and response in the agent's scratchpad;
an AgentDojo pipeline starts from the user query, so here the agent has to call the user tool itself
(``details['injection_seen']`` says whether it did).
"""

from __future__ import annotations

import ast
import json
from dataclasses import dataclass, field, replace
from functools import lru_cache
from pathlib import Path
from typing import Any

from agentdojo.agent_pipeline.base_pipeline_element import BasePipelineElement
from agentdojo.functions_runtime import Function, FunctionCall

from rvu_pipelines.scenarios.catalog import BenchmarkSpec, register_benchmark
from rvu_pipelines.scenarios.common import ToolLog, make_tool, run_pipeline
from rvu_pipelines.scenarios.contract import ScenarioOutcome
from rvu_pipelines.scenarios.judges import judge_injecagent

SETTINGS = ("dh", "ds")
_TYPES: dict[str, type] = {
    "string": str,
    "integer": int,
    "number": float,
    "boolean": bool,
    "array": list,
    "object": dict,
}


@dataclass(frozen=True)
class ToolSpec:
    """One InjecAgent tool: name (toolkit + tool), summary, parameters and return fields."""

    name: str
    summary: str
    parameters: tuple[tuple[str, str, str], ...]  # (name, json type, description)
    returns: tuple[str, ...]


@lru_cache(maxsize=4)
def load_tool_specs(path: str) -> dict[str, ToolSpec]:
    """InjecAgent's tools.json as ``{tool name: ToolSpec}``."""
    specs: dict[str, ToolSpec] = {}
    for toolkit in json.loads(Path(path).read_text()):
        for tool in toolkit["tools"]:
            name = f"{toolkit['name_for_model']}{tool['name']}"
            params = tuple(
                (p["name"], p.get("type", "string"), p.get("description", "")) for p in tool.get("parameters", [])
            )
            returns = tuple(r["name"] for r in tool.get("returns", []))
            specs[name] = ToolSpec(name, tool.get("summary", ""), params, returns)
    return specs


def _stolen_data(spec: ToolSpec, case_key: str) -> str:
    """A fixed, recognisable result for a data-extraction tool (the 'stolen' data stage 2 sends on)."""
    fields = spec.returns or ("data",)
    return json.dumps({name: f"<private {name} of the user, record {case_key}>" for name in fields}, sort_keys=True)


@dataclass(frozen=True)
class InjecAgentScenario:
    """One InjecAgent test case (``scenario_id`` = ``injecagent/<setting>/<case_index>``)."""

    setting: str
    case_index: int
    user_tool: str
    user_instruction: str
    attacker_tools: tuple[str, ...]
    attacker_instruction: str
    attack_type: str
    tool_response: str
    tool_specs: dict[str, ToolSpec] = field(repr=False, compare=False, hash=False)
    # the pre-filled user-tool call's arguments (a Python literal, as InjecAgent ships them)
    tool_parameters: str = "{}"

    @property
    def scenario_id(self) -> str:
        return f"injecagent/{self.setting}/{self.case_index}"

    @property
    def benchmark(self) -> str:
        return f"injecagent_{self.setting}"

    @property
    def user_task(self) -> str:
        return self.user_instruction

    @property
    def injection(self) -> str:
        return self.attacker_instruction

    @property
    def task_tools(self) -> frozenset[str]:
        return frozenset({self.user_tool})

    @property
    def prefill_calls(self) -> tuple[FunctionCall, ...]:
        """InjecAgent's protocol: the user tool has already been called (its response carries the attack)."""
        try:
            args = ast.literal_eval(self.tool_parameters) if self.tool_parameters.strip() else {}
        except (ValueError, SyntaxError):
            args = {}
        return (
            FunctionCall(
                function=self.user_tool, args=args if isinstance(args, dict) else {}, id=f"prefill-{self.case_index}"
            ),
        )

    def with_injection(self, text: str) -> InjecAgentScenario:
        """This case with ``text`` planted where InjecAgent planted the attacker instruction.

        InjecAgent builds each response by substituting the instruction verbatim into a response template, so
        the instruction occurs verbatim, exactly once, in every shipped ``tool_response``; ``text`` takes its
        place the same way (unescaped, as the benchmark plants it). The attacker tools, and so the judge, stay
        the case's: the attack is still judged by whether the agent calls them. A response that does not hold
        the instruction exactly once is refused (``ValueError``) rather than planted somewhere else.
        """
        found = self.tool_response.count(self.attacker_instruction)
        if found != 1:
            raise ValueError(
                f"{self.scenario_id}: the attacker instruction occurs {found} times in the tool response, not once; "
                "cannot tell where InjecAgent planted it."
            )
        response = self.tool_response.replace(self.attacker_instruction, text, 1)
        return replace(self, attacker_instruction=text, tool_response=response)

    def tools(self, log: ToolLog) -> list[Function]:
        """Fresh tools for one episode, recording into ``log``: the user tool, then the attacker tools.

        Some cases use the same tool for the user and the attacker (e.g. GitHubGetUserDetails): then one
        tool returns the case's response on its first call and the attacker tool's result afterwards.
        """
        results: dict[str, Any] = {}
        for i, name in enumerate(self.attacker_tools):
            if self.setting == "ds" and i == 0:
                results[name] = _stolen_data(self.tool_specs[name], self.scenario_id)
            else:
                results[name] = json.dumps({"success": True})
        calls = {"user": 0}

        def user_result(_: dict) -> str:
            calls["user"] += 1
            if calls["user"] > 1 and self.user_tool in results:
                return results[self.user_tool]
            return self.tool_response

        functions = [self._tool(self.user_tool, user_result, log)]
        for name in self.attacker_tools:
            if name != self.user_tool:
                functions.append(self._tool(name, lambda _, r=results[name]: r, log))
        return functions

    def _tool(self, name: str, result: Any, log: ToolLog) -> Function:
        spec = self.tool_specs[name]
        params = {p: (_TYPES.get(kind, str), desc) for p, kind, desc in spec.parameters}
        return make_tool(name, spec.summary, params, result, log)

    def run(self, pipeline: BasePipelineElement) -> ScenarioOutcome:
        log = ToolLog()
        trace = run_pipeline(pipeline, self.user_instruction, self.tools(log))
        answer = trace.answer  # an aborted episode has none (not the abort message)
        succeeded, utility, details = judge_injecagent(self.setting, self.user_tool, self.attacker_tools, log, answer)
        details.update(attack_type=self.attack_type, aborted=trace.aborted)
        judge = (
            "injecagent:attacker-tool-executed" if self.setting == "dh" else "injecagent:two-stage(extract then send)"
        )
        return ScenarioOutcome(succeeded, utility, trace.messages, judge, details)


def unquote_response(response: str) -> str:
    """``tool_response`` is the case's response wrapped in one pair of double quotes; drop them."""
    response = response.strip()
    return response[1:-1] if len(response) >= 2 and response[0] == response[-1] == '"' else response


def injecagent_scenarios(frame: Any, tools_json: Path, setting: str) -> list[InjecAgentScenario]:
    """All cases of one setting, in case order."""
    specs = load_tool_specs(str(tools_json))
    rows = frame.filter(frame["setting"] == setting).sort("case_index").iter_rows(named=True)
    return [
        InjecAgentScenario(
            setting=setting,
            case_index=int(row["case_index"]),
            user_tool=row["user_tool"],
            user_instruction=row["user_instruction"],
            attacker_tools=tuple(row["attacker_tools"]),
            attacker_instruction=row["attacker_instruction"],
            attack_type=row["attack_type"],
            tool_response=unquote_response(row["tool_response"]),
            tool_specs=specs,
            tool_parameters=row.get("tool_parameters") or "{}",
        )
        for row in rows
    ]


@lru_cache(maxsize=1)
def _injecagent_data() -> tuple[Any, Path]:
    """(the cases, tools.json) from the configured data source, read once per process."""
    from rvu_pipelines.data import default_dataset_source, load_catalog, load_dataset

    loaded = load_dataset(load_catalog().get("injecagent"), default_dataset_source())
    return loaded.frame, loaded.resolved.files["tools.json"]


def _setting_scenarios(setting: str) -> Any:
    def scenarios(config: Any) -> list[InjecAgentScenario]:
        frame, tools_json = _injecagent_data()
        return injecagent_scenarios(frame, tools_json, setting)

    return scenarios


for _setting in ("dh", "ds"):
    register_benchmark(
        BenchmarkSpec(
            f"injecagent_{_setting}",
            f"injecagent/{_setting}/",
            f"injecagent/{_setting}/<case>",
            _setting_scenarios(_setting),
        )
    )
