"""The red team's tools on the agent itself: optimisation slots cut from a defense's real prompts, the optimiser
runs that produce the stored attack strings, and the held-out attack table with its paired comparisons.

It sits above :mod:`rvu_pipelines.agents` (it builds the defenses' pipelines and runs the harness), while the
registered attacks the harness applies stay below it in :mod:`rvu_pipelines.attacks`.
"""
