"""Stage 2, training: an EAGLE-3 draft (speculators' ``Eagle3DraftModel``) on extracted hidden
states.

``stage.train`` is the stage function; ``data`` reads and batches the hidden states, ``loop`` runs
the TTT steps, ``metrics`` turns per-position counts into accuracies and the simulated acceptance
length, ``state`` checkpoint and resume exactly, ``vocab`` builds the draft vocabulary
(d2t/t2d), ``draft_model`` builds and saves the model, ``launch`` / ``distributed`` / ``worker`` run
it on several GPUs through torchrun.
"""
