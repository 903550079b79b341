"""eagle3-pipeline library: extraction, training, conversion, validation, serving and benchmarking
of EAGLE-3 draft models. Plain Python: this package imports neither Prefect nor MLflow (tests
enforce it)."""

__version__ = "0.1.0"
