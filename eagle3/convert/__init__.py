"""Stage 3, conversion and checks: a speculators draft → what the serving engine loads, proven to
load and to compute what was trained.

``stage.convert`` writes the serving checkpoint; ``validate`` runs every file-level check in
``checks`` (over the ``checkpoint`` reader) against the engine's profile (``eagle3.engines``);
``equivalence`` runs the draft as trained and as the engine computes it on the same hidden states.
"""
