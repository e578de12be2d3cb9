"""Attacks on the agent: each rewrites the injection a scenario plants, so any benchmark runs under any attack.

``native`` leaves a benchmark's own injections as they are; the others (a forged chat turn, strings optimised on
the agent's own weights, and attacks adapted to the defense they face) are registered by name in
:mod:`rvu_pipelines.attacks.catalog`.
"""
