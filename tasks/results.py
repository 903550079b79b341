"""Typed, frozen hand-overs between the stage tasks (what each task returns and Prefect caches).

Tasks hand each other directories with a ``manifest.json`` (docs/INTERNALS.md); these handles say
where a stage's output is and what it measured, so a flow reads ``draft.dir`` and
``bench.acceptance_length`` instead of string keys of a dict. All are frozen dataclasses (picklable
for Prefect's result store); ``metrics`` are MLflow metric values (floats) keyed by metric name.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any


@dataclass(frozen=True)
class StageResult:
    """One stage's output: ``dir`` (its folder, with ``manifest.json``), the manifest's
    ``content_hash``, the MLflow run that made it, its metrics, the draft variant (``trained`` /
    ``untrained``) and, for a benchmark, the served acceptance length (bonus token counted; None
    when the engine gave no speculative fields)."""

    stage: str
    dir: Path
    content_hash: str
    mlflow_run_id: str
    metrics: dict[str, float] = field(default_factory=dict)
    variant: str = "trained"
    acceptance_length: float | None = None

    def metric(self, name: str) -> float | None:
        """A metric by name, None when absent."""
        return self.metrics.get(name)


@dataclass(frozen=True)
class AcceptanceFigures:
    """The acceptance lengths of one pipeline run (bonus token counted): ``served`` (engine),
    ``untrained`` (the baseline draft served), ``offline`` (in-process reference decoding, same
    prompts), ``simulated`` (training validation), ``dev`` (measured during training on the
    development prompts, ``train.select_best_by=measured``), ``gain`` = served - untrained;
    ``minimum`` = the gate's threshold and ``passed`` whether served ≥ minimum, with the gate's
    diagnosis in ``failure`` when not. ``simulated`` and ``dev`` are the exported checkpoint's."""

    served: float | None
    untrained: float | None
    offline: float | None
    simulated: float | None
    offline_wall_s: float | None
    minimum: float
    passed: bool
    failure: str | None = None
    dev: float | None = None

    @property
    def gain(self) -> float | None:
        if self.served is None or self.untrained is None:
            return None
        return self.served - self.untrained

    @property
    def beats_baseline(self) -> bool:
        return self.gain is not None and self.gain > 0

    def to_dict(self) -> dict[str, Any]:
        return {**asdict(self), "gain": self.gain, "beats_baseline": self.beats_baseline}


@dataclass(frozen=True)
class RegisteredDraft:
    """A model-registry version: ``name`` (``eagle3-draft-<target>``), ``version``, the version
    alias ``best`` points at, the artifact ``source`` (``runs:/<run>/draft``) and whether this call
    created it."""

    name: str
    version: str
    best_version: str
    source: str
    new: bool

    @property
    def ref(self) -> str:
        return f"{self.name}/{self.version}"
