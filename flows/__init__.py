"""Prefect flows of the pipeline: the whole pipeline (``flows.pipeline``), one flow per stage
(``flows.stages``), sweeps (``flows.sweep``), and reading a run's decision back
(``flows.decision``)."""
