"""The defended agents of the attack table: the defenses (AgentDojo pipelines), one episode, a cell of
episodes, the harness that runs cells, and the regression check against the golden results.

Depends on rvu_pipelines.scenarios (the attacks and their contract), never the reverse. Nothing is
imported here: the Dagster code location imports the harness, which must not pull in AgentDojo.
"""
