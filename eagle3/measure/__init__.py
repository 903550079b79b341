"""Stage 5, measurement: acceptance length and throughput of a served (or in-process) draft.

``bench``: the benchmark client and the acceptance gate; ``acceptance``: the arithmetic and the
engine's counters; ``prompts``: the prompt sets; ``plots``: the figures; ``served``: serve, measure,
tear down; ``replay``: exact greedy replay; ``offline``: the offline figure from it (one draft on
the bench prompts, or many drafts on whole prompt sets with ``spread``'s bootstrap interval)."""
