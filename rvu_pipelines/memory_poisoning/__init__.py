"""Memory poisoning of retrieval-augmented agents and its write-time detection (seed 003, MEMSAD).

The agent's memory is a FAISS index over embedded entries (``retrieval``) built from AgentPoison's
ReAct-StrategyQA memory (``corpus``). Attacks (``attacks``) write poisoned entries that victim
queries retrieve; detectors score a candidate entry *before* it is written (MEMSAD in ``memsad``,
the seed's baselines and two more in ``baselines``, the discrete check in ``hybrid``). ``study``
runs the attack-defense matrix, ``sir`` the multi-agent propagation simulation. Plain Python:
the Dagster layer is ``assets/memory_poisoning.py``.
"""
