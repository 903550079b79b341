"""Stage 5, measurement: acceptance length and throughput of a served (or in-process) draft.

``bench`` is the benchmark client and the offline (in-process) figure, ``acceptance`` the arithmetic
and the parsing of engine counters, ``prompts`` the prompt sets, ``plots`` the figures. ``replay``
(with ``replay_core``, ``replay_draft``, ``replay_cli``) is the exact greedy chain acceptance of
many drafts on whole prompt sets from a few batched forwards, ``spread`` its bootstrap interval.
"""
