"""Stage 5, measurement: acceptance length and throughput of a served (or in-process) draft.

``bench``: client and gate; ``acceptance``: arithmetic and engine counters; ``prompts``; ``plots``;
``served``: serve, measure, tear down; ``replay``: exact greedy replay; ``offline``: its figure."""
