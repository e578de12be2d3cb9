"""E1 with adapters: recoveries compared session by session, with the attacks that succeeded beside them."""

from __future__ import annotations


def test_v1_and_v2_are_compared_session_by_session() -> None:
    from rvu_pipelines.adapters.incidents import RecoveryScore, paired_difference
    from rvu_pipelines.adapters.report import incidents_markdown

    def row(session: str, mode: str, residual: int, benign_lost: int) -> RecoveryScore:
        return RecoveryScore(session, mode, 20, 6, 1, 6 - residual + benign_lost, residual, 0, benign_lost, 0, False)

    residual_v1 = [5, 4, 6, 5, 3, 4, 5, 6]
    scores = [row(f"s{i}", "v1", r, 0) for i, r in enumerate(residual_v1)]
    scores += [row(f"s{i}", "v2", r - 2, 1) for i, r in enumerate(residual_v1)]  # v2 removes two more, loses one
    scores += [row("extra", "v2", 0, 0)]  # a session only one mode saw is not paired
    paired = paired_difference(scores, "v1", "v2")
    assert paired["n_sessions"] == 8
    assert paired["residual"]["mean"] == -2.0 and paired["residual"]["wilcoxon_p"] < 0.01
    assert paired["benign_lost"]["mean"] == 1.0
    same = paired_difference(scores, "v1", "v1")
    assert same["residual"]["wilcoxon_p"] == "not run"
    summary = {"sessions": 8, "episodes": 24, "attacks_succeeded": 3, "paired": {"v2 - v1": paired}}
    summary |= {"adapter_changed_calls": 5, "adapted_calls": 9}
    table = incidents_markdown({"benchmark": "injecagent", "detector": "d", "adapters": {"a": {"summary": summary}}})
    assert "| a | 3 (24) | v2 - v1 | 8 | -2.00 [" in table
