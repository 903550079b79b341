"""The launch flags, and what the pinned SGLang release changes or fakes in the speculative
settings, read from the released source (``tests/unit/test_sglang_serving.py``;
docs/ENGINE_FACTS.md §4 S11-S15):

- **max_running_requests** (S11): ``arg_groups/speculative_hook.py`` ``_handle_eagle_family`` sets
  it to ``RELEASES[v]["spec_max_running_requests"]`` (48) when unset.
- **draft tokens** (S12): with ``speculative_eagle_topk == 1``, ``speculative_num_draft_tokens =
  speculative_num_steps + 1`` whatever was asked.
- **scheduler** (S13): EAGLE/EAGLE3 always run ``EAGLEWorkerV2`` (``speculative/spec_info.py``); the
  overlap scheduler is on unless ``--disable-overlap-schedule``, device ``cpu``
  (``_disable_overlap_schedule_for_cpu``) or pipeline parallelism > 1 (``arg_groups/overrides.py``).
  Tree drafting (top-k > 1) runs under it too.
- **simulated acceptance** (S14): ``SGLANG_SIMULATE_ACC_LEN`` (``environ.py``, ``EnvFloat(-1)``; the
  legacy ``SGL_`` prefix is rewritten) > 0 makes the engine accept a simulated number of draft
  tokens (``speculative/spec_utils.py``).
- **/server_info** (S15) returns the *resolved* settings (``server_args.resolved_dict()``), read
  back after launch (:func:`compare_server_info`).
"""

from __future__ import annotations

import math
import re
from dataclasses import dataclass
from typing import Any, Mapping, Sequence

from eagle3.engines.sglang.profile import RELEASES, VERSION
from eagle3.engines.sglang.server_flags import nargs, options

SPEC_DEFAULT_MAX_RUNNING_REQUESTS = RELEASES[VERSION]["spec_max_running_requests"]
SIMULATE_ENV = ("SGLANG_SIMULATE_ACC_LEN", "SGL_SIMULATE_ACC_LEN")


@dataclass(frozen=True)
class LaunchFlag:
    """One ``serve.<field>`` and its launch flag. ``spec``: only with a draft. ``switch``:
    valueless, given when true. ``skip``: value that omits it. ``reference``: values the reference
    engine honours (None: any); ``ref_flag``: passed to it too. ``resolved``: in /server_info."""

    field: str
    flag: str
    spec: bool = False
    switch: bool = False
    skip: Any = None
    reference: tuple | None = (None,)
    ref_flag: bool = False
    resolved: bool = False


LAUNCH_FLAGS = (
    LaunchFlag("speculative_num_steps", "--speculative-num-steps", spec=True, reference=None,
               ref_flag=True, resolved=True),
    LaunchFlag("speculative_eagle_topk", "--speculative-eagle-topk", spec=True, reference=(1,),
               ref_flag=True, resolved=True),
    LaunchFlag("speculative_num_draft_tokens", "--speculative-num-draft-tokens", spec=True,
               reference=None, ref_flag=True, resolved=True),
    LaunchFlag("tp", "--tp-size", reference=(1,)),
    LaunchFlag("max_running_requests", "--max-running-requests", resolved=True),
    LaunchFlag("mem_fraction_static", "--mem-fraction-static"),
    LaunchFlag("disable_cuda_graph", "--disable-cuda-graph", switch=True, skip=False,
               reference=None, ref_flag=True),
    LaunchFlag("cuda_graph_max_bs", "--cuda-graph-max-bs-decode"),  # the release's unambiguous name
    LaunchFlag("context_length", "--context-length", reference=None, ref_flag=True),
)
RESOLVED_KEYS = tuple(f.field for f in LAUNCH_FLAGS if f.resolved) + ("disable_overlap_schedule",)


def launch_args(serve: Any, *, draft: bool, engine: str = "sglang") -> list[str]:
    """:data:`LAUNCH_FLAGS` for ServeConfig ``serve`` and ``engine``, in table order."""
    out: list[str] = []
    for f in LAUNCH_FLAGS:
        value = getattr(serve, f.field)
        if (f.spec and not draft) or value == f.skip or (engine != "sglang" and not f.ref_flag):
            continue
        out += [f.flag] if f.switch else [f.flag, str(value)]
    return out


def reference_refusals(serve: Any) -> dict:
    """``{"serve.<field>": value}`` for the settings the reference engine cannot honour."""
    return {f"serve.{f.field}": getattr(serve, f.field) for f in LAUNCH_FLAGS
            if f.reference is not None and getattr(serve, f.field) not in f.reference}


@dataclass(frozen=True)
class ArgvRules:
    """One engine's argparse command line, for :func:`extra_args_problems`: ``engine`` (its name in
    messages), ``options`` (``{option string: canonical flag}``, aliases and ``-h`` included),
    ``nargs`` (``"0" | "?" | "*" | "+"`` of every option not taking exactly one value),
    ``allow_abbrev`` (argparse's), ``unknown_exit`` (what it does with a token it does not take,
    after "would"), ``help_hint`` (where to read its flags)."""

    engine: str
    options: Mapping[str, str]
    nargs: Mapping[str, str]
    allow_abbrev: bool = True
    unknown_exit: str = "exit with 'unrecognized arguments'"
    help_hint: str = ""


def sglang_rules(version: str = VERSION) -> ArgvRules:
    """SGLang ``version``'s ``launch_server`` command line
    (:func:`eagle3.engines.sglang.server_flags.options` and ``nargs``; its parser keeps
    argparse's ``allow_abbrev=True``). KeyError for a release without a profile."""
    return ArgvRules(f"SGLang {version}", options(version), nargs(version),
                     help_hint=" (read the flags with `python -m sglang.launch_server --help` "
                               "in the SGLang environment)")


def _matches(token: str, rules: ArgvRules) -> list[str]:
    """The option strings of ``rules`` that ``token`` selects (:func:`flag_matches`)."""
    if token == "-h":
        return ["-h"] if "-h" in rules.options else []
    if not token.startswith("--") or token == "--":
        return []
    name = token.split("=", 1)[0]
    if name in rules.options:
        return [name]
    return sorted(o for o in rules.options if o.startswith(name)) if rules.allow_abbrev else []


def flag_matches(token: str, version: str = VERSION) -> list[str]:
    """The option strings of SGLang ``version`` that ``token`` selects by argparse's
    ``allow_abbrev=True`` rules (``ArgumentParser._parse_optional``): the exact name (before any
    ``=``), else every option it prefixes; ``[]`` for a value, ``--`` or no match; several:
    ambiguous, which argparse refuses."""
    return [] if token == "-h" else _matches(token, sglang_rules(version))


def canonical_flag(token: str, version: str = VERSION) -> str | None:
    """The canonical SGLang flag ``token`` sets (an alias or an unambiguous prefix resolved, e.g.
    ``--mem-frac`` -> ``--mem-fraction-static``, ``--speculative-draft-model`` ->
    ``--speculative-draft-model-path``); None for a value, an unknown or an ambiguous token."""
    hits = flag_matches(token, version)
    return options(version)[hits[0]] if len(hits) == 1 else None


def canonical_args(argv: Sequence[str], version: str = VERSION) -> list[str]:
    """``argv`` with every option token that SGLang resolves to one flag written as that flag
    (``--chat-templ=x`` -> ``--chat-template=x``); values and unresolved tokens unchanged."""
    out = []
    for a in argv:
        flag = canonical_flag(a, version)
        out.append(a if flag is None else flag + a[len(a.split("=", 1)[0]):])
    return out


# flags the launcher sets itself or that a serve.* field (read by the pre-flight) owns
OWNED_FLAGS = {"--model-path": "the target folder", "--host": "serve.host",
               "--speculative-algorithm": "EAGLE3 with a draft", "--dtype": "serve.dtype",
               "--speculative-draft-model-path": "the converted draft",
               "--port": "serve.port or a free one",
               **{f.flag: f"serve.{f.field}" for f in LAUNCH_FLAGS
                  if f.field != "max_running_requests"}}


_NEGATIVE_NUMBER = re.compile(r"^-\d+$|^-\d*\.\d+$")


def option_like(token: str) -> bool:
    """True when SGLang's argparse reads ``token`` as an option rather than a value
    (``ArgumentParser._parse_optional``): it starts with ``-``, is longer than ``-``, is no
    negative number (the parser has no option that looks like one) and holds no space."""
    return (token.startswith("-") and token != "-" and not _NEGATIVE_NUMBER.match(token)
            and " " not in token)


def extra_args_problems(extra: Sequence[str], generated: Sequence[str] = (),
                        version: str = VERSION,
                        rules: ArgvRules | None = None) -> list[tuple[str, str]]:
    """``(code, message)`` for each ``serve.extra_args`` token the engine would not take as
    written, walking the list as its argparse does under ``rules`` (None: :func:`sglang_rules` of
    ``version``). Codes: ``EXTRA_ARG_UNKNOWN`` (no such flag), ``EXTRA_ARG_AMBIGUOUS`` (a prefix of
    several), ``EXTRA_ARG_HELP`` (``-h``/``--help``: it prints help and exits 0, no server),
    ``EXTRA_ARG_NO_VALUE`` (a value-taking flag last or before another option),
    ``EXTRA_ARG_SWITCH_VALUE`` (``--switch=value``), ``EXTRA_ARG_STRAY`` (a value no flag takes:
    neither engine has a positional argument), ``EXTRA_ARG_OWNED`` (a flag, alias or prefix of one
    in :data:`OWNED_FLAGS` or ``generated``: argparse keeps the last value, silently replacing the
    pipeline's)."""
    rules = rules or sglang_rules(version)
    eng, table, counts = rules.engine, rules.options, rules.nargs

    def canonical(a: str) -> str | None:
        hits = _matches(a, rules)
        return table[hits[0]] if len(hits) == 1 else None

    mine = {canonical(a) or a.split("=", 1)[0] for a in generated if a.startswith("--")}
    out, i = [], 0
    while i < len(extra):
        token = extra[i]
        i += 1
        if token == "--":  # argparse's end of options; what follows is judged as values
            continue
        if not option_like(token):
            prev = extra[i - 2] if i > 1 else None
            where = ("first in the list" if prev is None
                     else f"after {prev!r}, which takes {_takes(prev, rules)}"
                     if option_like(prev) else f"after the value {prev!r}")
            out.append(("EXTRA_ARG_STRAY", f"serve.extra_args {token!r}: expected a flag, got a "
                        f"value no flag takes ({where}); {eng}'s launch_server has no "
                        f"positional argument and would {rules.unknown_exit}"))
            continue
        hits = _matches(token, rules)
        if len(hits) != 1:
            out.append(("EXTRA_ARG_AMBIGUOUS", f"serve.extra_args {token!r}: expected one flag, "
                        f"got a prefix of {len(hits)} ({', '.join(hits[:6])}"
                        f"{', ...' if len(hits) > 6 else ''}); {eng}'s argparse refuses it: "
                        "write the full flag") if hits else
                       ("EXTRA_ARG_UNKNOWN", f"serve.extra_args {token!r}: expected a flag of "
                        f"{eng}'s launch_server, got one it does not know (it would "
                        f"{rules.unknown_exit})"))
            while i < len(extra) and not option_like(extra[i]):  # its values, if any
                i += 1
            continue
        flag, count = table[hits[0]], counts.get(hits[0], "1")
        if flag == "--help":
            out.append(("EXTRA_ARG_HELP", f"serve.extra_args {token!r}: expected flags for the "
                        f"server, got the help flag: {eng} prints its help and exits, so no "
                        f"server starts; remove it{rules.help_hint}"))
            continue
        if "=" in token:
            if count == "0":
                out.append(("EXTRA_ARG_SWITCH_VALUE", f"serve.extra_args {token!r}: {flag} takes "
                            f"no value (a switch), got one after '='; {eng}'s argparse exits "
                            "with 'ignored explicit argument': write it alone"))
        elif count in ("1", "+") and (i >= len(extra) or option_like(extra[i])):
            nxt = f"followed by {extra[i]!r}" if i < len(extra) else "last in the list"
            out.append(("EXTRA_ARG_NO_VALUE", f"serve.extra_args {token!r}: {flag} takes "
                        f"{_COUNT_WORDS[count]}, got none ({nxt}); {eng} exits with "
                        "'expected one argument' (or takes the next flag as its value): give it "
                        f"one, e.g. [{token!r}, VALUE] or '{token}=VALUE'"))
        elif count in ("1", "?"):
            i += 1 if i < len(extra) and not option_like(extra[i]) else 0
        elif count in ("+", "*"):
            while i < len(extra) and not option_like(extra[i]):
                i += 1
        if flag in OWNED_FLAGS or flag in mine:
            how = "" if token.split("=", 1)[0] == flag else f" ({eng} reads it as {flag})"
            out.append(("EXTRA_ARG_OWNED", f"serve.extra_args {token!r}{how}: expected only "
                        f"flags the launcher does not set, got {flag}, which it sets from "
                        f"{OWNED_FLAGS.get(flag, 'a serve.* field')}; the engine keeps the last "
                        "value, so this one would silently replace it: set it there instead"))
    return out


_COUNT_WORDS = {"0": "no value", "?": "an optional value", "*": "any number of values",
                "1": "one value", "+": "one or more values"}


def _takes(token: str, rules: ArgvRules) -> str:
    """How many values the option ``token`` takes under ``rules``, in words."""
    hits = _matches(token, rules)
    if len(hits) != 1:
        return f"no value {rules.engine} would accept (it is refused)"
    return _COUNT_WORDS[rules.nargs.get(hits[0], "1")]


def flag_value(argv: Sequence[str], flag: str) -> str | None:
    """``flag``'s value in argv (``--flag V`` / ``--flag=V``, last wins; ``"true"`` without a value;
    None if absent). Tokens are matched as SGLang's parser reads them (:func:`canonical_args`:
    aliases and unambiguous prefixes count as the flag)."""
    value, argv = None, canonical_args(argv)
    flag = canonical_flag(flag) or flag
    for i, a in enumerate(argv):
        if a == flag:
            nxt = argv[i + 1] if i + 1 < len(argv) else None
            value = nxt if nxt is not None and not nxt.startswith("--") else "true"
        elif a.startswith(flag + "="):
            value = a.split("=", 1)[1]
    return value


def running_requests(serve: Any) -> tuple[int, int | None]:
    """``(requests SGLang runs at once, the limit given or None)``; unset: the release default."""
    arg = flag_value(serve.extra_args, "--max-running-requests")
    given = int(arg) if arg not in (None, "true") and arg.isdigit() else serve.max_running_requests
    return (SPEC_DEFAULT_MAX_RUNNING_REQUESTS if given is None else given), given


def chain_draft_tokens(steps: int, topk: int, asked: int) -> int:
    """Draft tokens SGLang verifies: ``steps + 1`` for top-k 1, else ``asked``."""
    return steps + 1 if topk == 1 else asked


# ------------------------------------------------------------------ rules, one message each

def draft_tokens_problem(serve: Any) -> str | None:
    """Chain drafting with ``speculative_num_draft_tokens`` other than ``steps + 1``."""
    s = serve
    want = chain_draft_tokens(s.speculative_num_steps, s.speculative_eagle_topk,
                              s.speculative_num_draft_tokens)
    if want == s.speculative_num_draft_tokens:
        return None
    return ("serve.speculative_num_draft_tokens: chain drafting (speculative_eagle_topk 1) "
            f"verifies speculative_num_steps + 1 = {want} tokens, got "
            f"{s.speculative_num_draft_tokens} (SGLang {VERSION} would silently use {want}; the "
            "reference engine refuses it)")


def concurrency_problem(serve: Any, concurrency: int) -> str | None:
    """``bench.concurrency`` above the requests SGLang runs at once (the benchmark would queue)."""
    running, given = running_requests(serve)
    if concurrency <= running:
        return None
    why = (f"SGLang {VERSION} resets max_running_requests to {SPEC_DEFAULT_MAX_RUNNING_REQUESTS} "
           "when speculative decoding is on and it is unset" if given is None
           else f"serve.max_running_requests is {given}")
    return (f"bench.concurrency {concurrency}: expected at most the {running} requests the engine "
            f"runs at once ({why}); the benchmark would measure queueing, not concurrency "
            f"{concurrency}: set serve.max_running_requests >= {concurrency} or lower "
            "bench.concurrency")


def simulated_acceptance(env: Mapping[str, str]) -> tuple[str, str] | None:
    """``(name, value)`` of a simulated-acceptance variable above 0 (or not a float), else None."""
    for name in SIMULATE_ENV:
        raw = env.get(name)
        if raw is None or str(raw).strip() == "":
            continue
        try:
            if float(raw) <= 0 and math.isfinite(float(raw)):
                continue
        except ValueError:
            pass
        return name, str(raw)
    return None


def simulation_problem(env: Mapping[str, str], where: str) -> str | None:
    """The message for a simulated-acceptance variable in ``env`` (``where``: whose environment)."""
    if (sim := simulated_acceptance(env)) is None:
        return None
    return (f"{sim[0]}={sim[1]!r} in {where}: expected unset (or <= 0); SGLang would report a "
            "simulated acceptance length, and no measured figure may come from such a server")


def resolve(serve: Any, device: str = "cuda") -> dict:
    """The settings the release runs ``serve`` with: ``{"max_running_requests",
    "max_running_requests_source", "num_draft_tokens", "num_draft_tokens_adjusted", "scheduler"
    ("overlap" | "synchronous"), "scheduler_reason", "drafting" ("chain" | "tree"), "worker"}``."""
    extra, topk = serve.extra_args, serve.speculative_eagle_topk
    running, given = running_requests(serve)
    device = flag_value(extra, "--device") or device
    pp = flag_value(extra, "--pp-size") or "1"  # its alias --pipeline-parallel-size too
    if flag_value(extra, "--disable-overlap-schedule") is not None:
        scheduler, why = "synchronous", "--disable-overlap-schedule"
    elif device == "cpu":
        scheduler, why = "synchronous", ("device cpu (speculative_hook.py "
                                         "_disable_overlap_schedule_for_cpu)")
    elif pp not in ("1", "true"):
        scheduler, why = "synchronous", (f"pipeline parallel size {pp} "
                                         "(overrides.py _pipeline_parallel_overlap_disable)")
    else:
        scheduler, why = "overlap", ("the default (no --disable-overlap-schedule, device not cpu, "
                                     "pp 1)")
    tokens = chain_draft_tokens(serve.speculative_num_steps, topk,
                                serve.speculative_num_draft_tokens)
    return {"max_running_requests": running,
            "max_running_requests_source": ("set" if given is not None else
                                            f"SGLang's speculative default ({running})"),
            "num_draft_tokens": tokens,
            "num_draft_tokens_adjusted": tokens != serve.speculative_num_draft_tokens,
            "scheduler": scheduler, "scheduler_reason": why,
            "drafting": "chain" if topk == 1 else "tree", "worker": "EAGLEWorkerV2"}


def asked_settings(serve: Any, engine: str) -> dict:
    """What a launch asked for, in ``/server_info``'s names (None: not asked)."""
    return {**{f.field: getattr(serve, f.field) for f in LAUNCH_FLAGS if f.resolved},
            "max_running_requests": running_requests(serve)[0] if engine == "sglang" else None}


def compare_server_info(info: Mapping[str, Any], asked: Mapping[str, Any]) -> dict:
    """The running engine's resolved settings (``GET /server_info``) against ``asked`` (keys of
    :data:`RESOLVED_KEYS`). Returns ``{"reported": {key: value or None}, "changed": {key: {"asked",
    "running"}}, "scheduler": "overlap" | "synchronous" | None}``; a key the server does not report
    (another engine) is None, not a change."""
    reported = {k: info.get(k) for k in RESOLVED_KEYS}
    changed = {k: {"asked": v, "running": reported[k]} for k, v in asked.items()
               if reported.get(k) is not None and v is not None and reported[k] != v}
    dos = reported.get("disable_overlap_schedule")
    return {"reported": reported, "changed": changed,
            "scheduler": None if dos is None else ("synchronous" if dos else "overlap")}


def running_problems(info: Mapping[str, Any] | None, concurrency: int) -> list[str]:
    """Why measuring this ``/server_info`` would mislead: fewer requests at once than
    ``concurrency``, or an exposed simulated-acceptance variable. Unreported fields pass."""
    if not info:
        return []
    out = []
    mrr = info.get("max_running_requests")
    if isinstance(mrr, int) and not isinstance(mrr, bool) and mrr < concurrency:
        out.append(f"server max_running_requests {mrr} < concurrency {concurrency}: the server "
                   f"runs at most {mrr} requests at once (SGLang resets it to "
                   f"{SPEC_DEFAULT_MAX_RUNNING_REQUESTS} with speculation unless "
                   "--max-running-requests is given), so the benchmark would measure queueing")
    sims = (simulation_problem((state.get("env_vars") or {}) if isinstance(state, Mapping) else {},
                               "the server's environment")
            for state in info.get("internal_states") or [])
    return out + [p for p in sims if p is not None][:1]
