"""The answer functions of regeneration: ``answer_fn(prefixes) -> answers``, one answer per
conversation prefix (a ``str``, a :class:`Truncated`, a :class:`Failed`, or None for a prompt too
long to send), by the target in-process (``hf``: batched ``generate``) or by a served target, many
requests in flight at once, in two protocols:

- ``sglang``: SGLang's native ``POST {url}/generate`` with ``input_ids`` rendered by the target's
  own chat template (``add_generation_prompt=True``, ``data.chat_template_kwargs``), greedy; the
  answer is ``output_ids`` decoded without special tokens (``text`` where a server sends no ids),
  so the prompts are those of the ``hf`` mode token for token. Without ``data.regenerate_url`` the
  target is launched by :func:`served_target` with the ``serve.*`` settings (SGLang, or the
  project's reference engine, which speaks the same API) and no draft, behind the readiness gate,
  and stopped when the regeneration ends.
- ``openai``: ``POST {url}/chat/completions`` (temperature 0) on any OpenAI-compatible server.

Against a server, conversations go side by side (:meth:`ServedAnswers.converse`): each turn is
asked as soon as its conversation's earlier turns are answered, ``data.regenerate_batch_size``
requests open at once, so the server's continuous batching, not the client, sets the pace.
``finish_reason`` ``length`` marks an answer :class:`Truncated`; a prompt longer than
``max_prompt_tokens`` is not sent (None: skipped, as in the ``hf`` mode); a request the server
refuses with 400 or 422 is :class:`Failed` for that turn alone.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import re
import time
from collections.abc import Callable, Iterator
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path

import torch

from eagle3.errors import ConfigError, DataError, TransientError

log = logging.getLogger(__name__)


class Truncated(str):
    """An answer that hit ``max_new_tokens`` before its end-of-turn token (an ``answer_fn`` returns
    it in place of a plain ``str``); kept and marked."""


@dataclass(frozen=True)
class Failed:
    """No answer for one prompt (returned by an ``answer_fn`` in place of a ``str``) and why; the
    original turn stays and counts as failed."""

    reason: str


RETRIES = 3  # attempts per request for connection failures, timeouts and 5xx answers
REFUSED = (400, 422)  # one prompt the server will not answer: that turn fails, the rest go on
OPEN_NOTE_S = 60.0  # a line every this many seconds while requests are still open


def shown_url(url: str) -> str:
    """``url`` without the user name and password it may carry, for messages and records."""
    return re.sub(r"//[^/@]*@", "//", url)


async def _post(client, url: str, body: dict, timeout_key: str) -> dict | list | Failed:
    """One POST with :data:`RETRIES` attempts for transient failures. The JSON answer, or
    :class:`Failed` for :data:`REFUSED` statuses. TransientError after the last attempt
    (connection failures, timeouts, 5xx); DataError for other non-200 answers (a wrong URL or path)
    and for answers that are not JSON."""
    import httpx

    where = f"regeneration endpoint {shown_url(url)}"
    for attempt in range(1, RETRIES + 1):
        try:
            r = await client.post(url, json=body)
        except httpx.TimeoutException as e:
            why = f"no answer within {timeout_key} ({type(e).__name__})"
        except httpx.TransportError as e:
            why = f"{type(e).__name__}: {e}"
        else:
            if r.status_code == 200:
                try:
                    return r.json()
                except ValueError as e:
                    raise DataError(f"{where}: expected a JSON answer, got {r.text[:200]!r}") from e
            if r.status_code in REFUSED:
                return Failed(f"HTTP {r.status_code}: {r.text[:200]}")
            if r.status_code < 500:
                hint = (" (SGLang's native API is at the server's root: drop /v1 from "
                        "data.regenerate_url)" if r.status_code == 404 and "/v1/" in url
                        and url.endswith("/generate") else "")
                raise DataError(f"{where}: expected HTTP 200, got {r.status_code}: "
                                f"{r.text[:200]}{hint}")
            why = f"HTTP {r.status_code}"
        if attempt == RETRIES:
            raise TransientError(f"{where}: {why} ({RETRIES} attempts)")
        await asyncio.sleep(attempt)
    raise AssertionError("unreachable")


def _run(jobs: list, work: Callable, one: Callable, limit: int, timeout_s: float, url: str,
         what: str) -> list:
    """``[await work(ask, job) for job in jobs]`` all at once, on an event loop of its own (in a
    worker thread when this thread already runs one), results in input order. ``ask(item)`` sends
    one request, ``await one(client, item)``, through one shared client with at most ``limit``
    requests open (``timeout_s`` per attempt); a None item is not sent and answers None. The first
    error cancels everything still open; so does Ctrl-C. A line every :data:`OPEN_NOTE_S` s names
    how many ``what`` are still open."""
    import httpx

    async def main() -> list:
        n = max(1, min(max(len(jobs), 1), limit))
        gate = asyncio.Semaphore(n)
        limits = httpx.Limits(max_connections=n, max_keepalive_connections=n)
        async with httpx.AsyncClient(timeout=timeout_s, limits=limits) as client:
            async def ask(item):
                if item is None:
                    return None
                async with gate:
                    return await one(client, item)

            tasks = [asyncio.ensure_future(work(ask, job)) for job in jobs]
            t0 = time.monotonic()
            try:
                while tasks:
                    done, pending = await asyncio.wait(tasks, timeout=OPEN_NOTE_S,
                                                       return_when=asyncio.FIRST_EXCEPTION)
                    for t in done:
                        if t.exception() is not None:
                            raise t.exception()
                    if not pending:
                        break
                    log.warning("regeneration: %d of %d %s at %s still open after %.0f s (each "
                                "request may take data.regenerate_timeout_s=%s s, %d attempts)",
                                len(pending), len(tasks), what, shown_url(url),
                                time.monotonic() - t0, timeout_s, RETRIES)
                return [t.result() for t in tasks]
            finally:
                for t in tasks:
                    t.cancel()
                await asyncio.gather(*tasks, return_exceptions=True)

    try:
        asyncio.get_running_loop()
    except RuntimeError:
        return asyncio.run(main())
    with ThreadPoolExecutor(1) as pool:
        return pool.submit(asyncio.run, main()).result()


class ServedAnswers:
    """The ``answer_fn`` of a served target: called on a batch of prefixes it sends them all at
    once; :meth:`converse` instead runs whole conversations side by side, each turn asked as soon
    as that conversation's earlier turns are answered, so no round waits for the slowest answer of
    another conversation. ``prepare(prefixes)`` gives the request items (None: not sent, e.g. over
    the prompt limit); ``one(client, item)`` sends one (a coroutine)."""

    def __init__(self, prepare: Callable, one: Callable, *, in_flight: int, timeout_s: float,
                 url: str, before: Callable | None = None):
        self.prepare, self.one, self.before = prepare, one, before
        self.in_flight, self.timeout_s, self.url = in_flight, timeout_s, url

    def __call__(self, prefixes: list[list[dict]]) -> list:
        if self.before is not None:
            self.before()

        async def work(ask, item):
            return await ask(item)

        return _run(self.prepare(prefixes), work, self.one, self.in_flight, self.timeout_s,
                    self.url, "requests")

    def converse(self, jobs: list[tuple[int, list[tuple[int, int]]]], prefix_of: Callable,
                 apply: Callable, name: Callable = str) -> None:
        """For each ``(k, [(round, message index), ...])`` of ``jobs``, in round order: ``prefix =
        prefix_of(k, i)`` (None: the turn is not asked; the caller has counted why), then
        ``apply(k, round, i, answer)`` with the answer, before the conversation's next turn.
        TransientError (a request that kept failing) names the conversation, ``name(k)``, and
        its turn."""
        if self.before is not None:
            self.before()

        async def work(ask, job):
            k, turns = job
            for r, i in turns:
                prefix = prefix_of(k, i)
                if prefix is None:
                    continue
                try:
                    answer = await ask(self.prepare([prefix])[0])
                except TransientError as e:
                    raise TransientError(f"{e}, asking assistant turn {r + 1} of conversation "
                                         f"{name(k)!r}") from e
                apply(k, r, i, answer)

        _run(jobs, work, self.one, self.in_flight, self.timeout_s, self.url, "conversations")


def _prompt_ids(tokenizer, prefixes: list[list[dict]], template_kwargs: dict | None
                ) -> list[list[int]]:
    kw = dict(template_kwargs or {})
    return [tokenizer(tokenizer.apply_chat_template(p, tokenize=False, add_generation_prompt=True,
                                                    **kw), add_special_tokens=False)["input_ids"]
            for p in prefixes]


def hf_answer_fn(model, tokenizer, max_new_tokens: int, template_kwargs: dict | None = None,
                 max_prompt_tokens: int | None = None):
    """An ``answer_fn`` doing batched greedy ``generate`` with the target (left padding). An answer
    without the tokenizer's EOS within ``max_new_tokens`` is a :class:`Truncated`; prompts over
    ``max_prompt_tokens`` get None. A batch raising ``torch.OutOfMemoryError`` is retried as two
    halves; a single prompt that does not fit raises DataError."""
    kwargs = dict(template_kwargs or {})

    def answer(prefixes: list[list[dict]]) -> list[str | None]:
        prompts = [tokenizer.apply_chat_template(p, tokenize=False, add_generation_prompt=True,
                                                 **kwargs) for p in prefixes]
        if max_prompt_tokens is None:
            return answer_all(prompts)
        keep = [i for i, x in enumerate(prompts)
                if len(tokenizer(x, add_special_tokens=False)["input_ids"]) <= max_prompt_tokens]
        if len(keep) == len(prompts):
            return answer_all(prompts)
        got = dict(zip(keep, answer_all([prompts[i] for i in keep]) if keep else []))
        return [got.get(i) for i in range(len(prompts))]

    def answer_all(prompts: list[str]) -> list[str]:
        try:
            return generate(prompts)
        except torch.OutOfMemoryError as e:
            if len(prompts) < 2:
                raise DataError(f"regeneration: one prompt of {len(prompts[0])} characters does "
                                f"not fit on the device ({e}); lower data.max_seq_len or "
                                "data.regenerate_max_new_tokens") from e
            half = len(prompts) // 2
            log.warning("regeneration: a batch of %d prompts ran out of device memory; generating "
                        "it as two batches of %d and %d (lower data.regenerate_batch_size to avoid "
                        "the retry)", len(prompts), half, len(prompts) - half)
            if torch.cuda.is_available():
                torch.cuda.empty_cache()
            return answer_all(prompts[:half]) + answer_all(prompts[half:])

    def generate(prompts: list[str]) -> list[str]:
        side, tokenizer.padding_side = tokenizer.padding_side, "left"
        try:
            enc = tokenizer(prompts, return_tensors="pt", padding=True, add_special_tokens=False)
        finally:
            tokenizer.padding_side = side
        eos = tokenizer.eos_token_id
        with torch.inference_mode():
            gen = model.generate(**enc.to(next(model.parameters()).device), do_sample=False,
                                 max_new_tokens=max_new_tokens,
                                 pad_token_id=tokenizer.pad_token_id, eos_token_id=eos)
        # a row without the end-of-turn token ran out of max_new_tokens
        return [(Truncated if eos is not None and eos not in row.tolist() else str)(
            tokenizer.decode(row, skip_special_tokens=True).strip())
            for row in gen[:, enc["input_ids"].shape[1]:]]

    return answer


def sglang_answer_fn(url: str, tokenizer, max_new_tokens: int, *,
                     template_kwargs: dict | None = None, max_prompt_tokens: int | None = None,
                     timeout_s: float = 600.0, in_flight: int = 256):
    """An ``answer_fn`` asking SGLang's native ``POST {url}/generate`` (greedy, ``input_ids`` from
    ``tokenizer``'s chat template). Returns per prefix a ``str``, a :class:`Truncated` (finish
    reason ``length``), a :class:`Failed` (HTTP 400/422, or finish reason ``abort`` with the
    server's message) or None (prompt over ``max_prompt_tokens`` tokens, not sent).
    ``timeout_s`` bounds each attempt; ``in_flight`` the requests open at once. TransientError /
    DataError as :func:`_post`; DataError for an answer without ``output_ids`` or a text
    ``text``."""
    endpoint = url.rstrip("/") + "/generate"
    sampling = {"temperature": 0.0, "max_new_tokens": max_new_tokens}

    async def one(client, ids: list[int]):
        body = await _post(client, endpoint, {"input_ids": ids, "sampling_params": sampling},
                           f"data.regenerate_timeout_s ({timeout_s} s)")
        if isinstance(body, Failed):
            return body
        body = body[0] if isinstance(body, list) and body else body
        out = body.get("output_ids") if isinstance(body, dict) else None
        text = body.get("text") if isinstance(body, dict) else None
        if not isinstance(out, list) and not isinstance(text, str):
            raise DataError(f"{shown_url(endpoint)}: expected an object with 'output_ids' (a list "
                            f"of token ids) or 'text' (a string), got {str(body)[:200]!r}")
        reason = (body.get("meta_info") or {}).get("finish_reason")
        kind = reason.get("type") if isinstance(reason, dict) else reason
        if kind == "abort":
            why = reason.get("message") if isinstance(reason, dict) else None
            return Failed(f"aborted by the server: {why or reason}")
        text = (tokenizer.decode(out, skip_special_tokens=True) if isinstance(out, list)
                else text).strip()
        return Truncated(text) if kind == "length" else text

    def prepare(prefixes: list[list[dict]]) -> list:
        ids = _prompt_ids(tokenizer, prefixes, template_kwargs)
        if max_prompt_tokens is not None:
            ids = [x if len(x) <= max_prompt_tokens else None for x in ids]
        return ids

    return ServedAnswers(prepare, one, in_flight=in_flight, timeout_s=timeout_s, url=endpoint)


def openai_answer_fn(url: str, model: str | None, max_new_tokens: int, timeout_s: float = 600.0,
                     *, tokenizer=None, template_kwargs: dict | None = None,
                     max_prompt_tokens: int | None = None, in_flight: int = 256):
    """An ``answer_fn`` asking an OpenAI-compatible server (``POST {url}/chat/completions``,
    temperature 0, the server's own chat template; ``template_kwargs`` go as
    ``chat_template_kwargs``). ``model`` None: the first id of ``GET {url}/models`` (``default``
    when the server lists none). Returns per prefix a ``str``, a :class:`Truncated`
    (``finish_reason`` ``length``), a :class:`Failed` (HTTP 400/422) or, given ``tokenizer`` and
    ``max_prompt_tokens``, None for a prompt over that many tokens (not sent). TransientError /
    DataError as :func:`_post`."""
    base = url.rstrip("/")
    endpoint = base + "/chat/completions"
    name: list[str] = [model] if model else []

    async def one(client, msgs: list[dict]):
        body = {"model": name[0], "messages": msgs, "temperature": 0.0,
                "max_tokens": max_new_tokens,
                **({"chat_template_kwargs": template_kwargs} if template_kwargs else {})}
        got = await _post(client, endpoint, body, f"data.regenerate_timeout_s ({timeout_s} s)")
        if isinstance(got, Failed):
            return got
        try:
            choice = got["choices"][0]
            text = choice["message"].get("content")
            if text is not None and not isinstance(text, str):
                raise TypeError(type(text).__name__)
        except (KeyError, IndexError, TypeError, AttributeError) as e:
            raise DataError(f"{shown_url(endpoint)}: expected choices[0].message.content (a "
                            f"string), got {str(got)[:200]!r}") from e
        reason = choice.get("finish_reason")
        if reason not in (None, "stop", "length") or text is None:
            return Failed(f"finish_reason {reason!r}" if text is not None
                          else f"no message content (finish_reason {reason!r})")
        text = text.strip()
        return Truncated(text) if reason == "length" else text

    def prepare(prefixes: list[list[dict]]) -> list:
        todo: list = list(prefixes)
        if tokenizer is not None and max_prompt_tokens is not None:
            lengths = map(len, _prompt_ids(tokenizer, prefixes, template_kwargs))
            todo = [p if n <= max_prompt_tokens else None for p, n in zip(prefixes, lengths)]
        return todo

    def before() -> None:
        if not name:
            name.append(_served_model(base, timeout_s))

    return ServedAnswers(prepare, one, in_flight=in_flight, timeout_s=timeout_s, url=endpoint,
                         before=before)


def _served_model(base: str, timeout_s: float) -> str:
    """The first model id ``GET {base}/models`` lists (the name an OpenAI-compatible server such as
    vLLM expects in each request), or ``default`` when it lists none or cannot say."""
    import httpx

    try:
        r = httpx.get(base + "/models", timeout=min(timeout_s, 30.0))
        ids = [m.get("id") for m in r.json().get("data", [])] if r.status_code == 200 else []
    except (httpx.HTTPError, ValueError, AttributeError):
        ids = []
    got = next((i for i in ids if isinstance(i, str) and i), None)
    log.info("regeneration: %s serves model %r%s", shown_url(base), got or "default",
             "" if got else " (no model listed at /models)")
    return got or "default"


def served_model(mode: str, url: str, timeout_s: float = 30.0) -> str | None:
    """The model a regeneration server at ``url`` says it serves: SGLang's ``GET
    /get_model_info`` ``model_path`` (``sglang``), the first id of ``GET /models`` (``openai``);
    None when it cannot say. Recorded with the regeneration's settings, so a resume against a
    server that now serves another model is refused."""
    import httpx

    path, key = ("/get_model_info", "model_path") if mode == "sglang" else ("/models", None)
    try:
        r = httpx.get(url.rstrip("/") + path, timeout=min(timeout_s, 30.0))
        body = r.json() if r.status_code == 200 else {}
        got = body.get(key) if key else next(
            (m.get("id") for m in body.get("data", []) if isinstance(m, dict)), None)
    except (httpx.HTTPError, ValueError, AttributeError, TypeError):
        got = None
    return got if isinstance(got, str) and got else None


def _check_served_model(url: str, target_dir: Path) -> None:
    """Log the model SGLang serves at ``url`` (:func:`served_model`); warn when its folder name is
    not the target's, or when the server cannot say, since answers of another model would be
    trained on silently."""
    served = served_model("sglang", url)
    if served is None:
        log.warning("regeneration: %s did not say which model it serves (GET /get_model_info); "
                    "expected the target %s", shown_url(url), target_dir)
    elif Path(served.rstrip("/")).name != Path(target_dir).name:
        log.warning("regeneration: %s serves %r, but the target is %s: expected the same model "
                    "(the draft learns the answers of the model that wrote them)",
                    shown_url(url), served, target_dir)
    else:
        log.info("regeneration: %s serves %s", shown_url(url), served)


@contextlib.contextmanager
def served_target(cfg, target_dir: Path, log_dir: Path, in_flight: int) -> Iterator[str]:
    """The target served by ``serve.engine`` with no draft (``serve.*`` settings; SGLang's running
    request limit raised to ``in_flight`` when lower), behind the readiness gate; yields its base
    URL and stops the process group on exit. GateFailed / ConfigError as
    :func:`eagle3.serve.launcher.launch_ready`; logs in ``log_dir``."""
    from eagle3.serve.launcher import launch_ready, resolve_engine

    s = cfg.serve
    if resolve_engine(cfg) == "sglang" and (s.max_running_requests or 0) < in_flight:
        log.info("regeneration server: serve.max_running_requests %s raised to %d (the requests "
                 "data.regenerate_batch_size keeps in flight)", s.max_running_requests, in_flight)
        cfg = cfg.model_copy(update={"serve": s.model_copy(
            update={"max_running_requests": in_flight})})
    t0 = time.monotonic()
    with launch_ready(cfg, target_dir, None, log_dir) as (engine, gate):
        log.info("regeneration server %s (%s) ready after %.1f s, phases %s", engine.url,
                 cfg.serve.engine, time.monotonic() - t0, gate.phases)
        yield engine.url


@contextlib.contextmanager
def answer_source(cfg, target_dir: Path, tokenizer, log_dir: Path) -> Iterator[Callable]:
    """The ``answer_fn`` of ``cfg.data.regenerate`` (``hf``, ``sglang``, ``openai``) for as long
    as the context lasts (a launched server or a loaded target is released after). ConfigError
    for ``openai`` without ``data.regenerate_url`` and for any other mode."""
    d = cfg.data
    batch = d.regenerate_batch_size or cfg.extract.batch_size
    common = {"template_kwargs": d.chat_template_kwargs, "max_prompt_tokens": d.max_seq_len,
              "in_flight": batch, "timeout_s": d.regenerate_timeout_s}
    if d.regenerate == "hf":
        from eagle3.target_model import load_target

        model, _ = load_target(target_dir, cfg.target.dtype, cfg.extract.device,
                               cfg.target.trust_remote_code)
        yield hf_answer_fn(model, tokenizer, d.regenerate_max_new_tokens,
                           d.chat_template_kwargs, max_prompt_tokens=d.max_seq_len)
    elif d.regenerate == "sglang":
        with contextlib.ExitStack() as stack:
            if d.regenerate_url:
                _check_served_model(d.regenerate_url, target_dir)
            url = d.regenerate_url or stack.enter_context(
                served_target(cfg, target_dir, log_dir, batch))
            yield sglang_answer_fn(url, tokenizer, d.regenerate_max_new_tokens, **common)
    elif d.regenerate == "openai":
        if not d.regenerate_url:
            raise ConfigError("data.regenerate_url: required when data.regenerate is 'openai' (got "
                              "none)")
        yield openai_answer_fn(d.regenerate_url, None, d.regenerate_max_new_tokens,
                               tokenizer=tokenizer, **common)
    else:
        raise ConfigError(f"data.regenerate: expected 'hf', 'sglang' or 'openai' to regenerate, "
                          f"got {d.regenerate!r}")
