"""Stage 2, training: an EAGLE-3 draft (speculators' ``Eagle3DraftModel``) on extracted hidden
states.

``stage.train`` is the stage function; ``launch`` / ``distributed`` / ``worker`` run it on several
GPUs through torchrun; each other module's docstring says what it holds.
"""
