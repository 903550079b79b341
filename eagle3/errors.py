"""Error taxonomy of the pipeline (docs/DESIGN.md, "Errors").

Only :class:`TransientError` may be retried by an orchestrator; every other error is a fact about
the inputs and is never retried. Messages name the file, key or field and both the expected and
actual value."""


class Eagle3Error(Exception):
    """Base class of every error the library raises on purpose."""


class TransientError(Eagle3Error):
    """May clear by itself (port in use, connection reset, 5xx from a tracking server)."""


class ConfigError(Eagle3Error):
    """A configuration value is missing, malformed or inconsistent with another one."""


class DataError(Eagle3Error):
    """Input data (conversations, hidden states, manifests) is unreadable, empty or inconsistent."""


class CheckpointInvalid(Eagle3Error):
    """A draft checkpoint would load wrongly (or not at all) in the chosen serving engine;
    ``problems``: the :class:`eagle3.convert.validate.Problem` records."""

    def __init__(self, message: str, problems: list | None = None):
        super().__init__(message)
        self.problems = list(problems or [])


class EngineUnsupported(Eagle3Error):
    """The serving engine (or its installed version) cannot do what the configuration asks."""


class GateFailed(Eagle3Error):
    """The readiness gate ended other than ``ready`` (crashed, stalled, timed out)."""

    def __init__(self, message: str, verdict: str = "", diagnostics_dir: str | None = None):
        super().__init__(message)
        self.verdict = verdict
        self.diagnostics_dir = diagnostics_dir


class AcceptanceTooLow(Eagle3Error):
    """The measured acceptance length is below the configured minimum."""


class TrainingDiverged(Eagle3Error):
    """NaN/Inf loss or grad norm; names the optimizer step and the (kept) last good checkpoint."""


class RankFailed(Eagle3Error):
    """A process of a multi-process job (torchrun rank, extraction worker) did not arrive, made no
    first step, stalled, or died. The message names the process(es), deadline and config key, last
    status and logs; re-running resumes (last complete checkpoint / committed shards).

    Attributes: ``ranks`` (indices at fault), ``kind`` (``not_arrived`` | ``no_first_step`` |
    ``stalled`` | ``died`` (signal or no error record) | ``failed`` (a non-project error, class and
    message in the text)), ``logs`` ({index: [paths]})."""

    def __init__(self, message: str, *, ranks: list[int] | None = None, kind: str = "",
                 logs: dict | None = None):
        super().__init__(message)
        self.ranks = list(ranks or [])
        self.kind = kind
        self.logs = dict(logs or {})
