"""Stage 1, extraction: conversations → the target's auxiliary hidden states on disk.

``stage.extract`` is the stage function; ``conversations`` reads and templates the records (loss
masks, truncation), ``hf_backend`` / ``sglang_backend`` run the target, ``store`` writes
speculators' offline layout (docs/INTERNALS.md, "Hidden-states layout"), ``regen`` regenerates
answers with the target itself.
"""
