"""Fixtures and harnesses shared by the tests and the benchmark scripts (never imported by the
library): synthetic hidden-state folders, the corpus of broken drafts, and the real SGLang 0.5.23
run on the CPU."""
