"""Regeneration by a served target (eagle3.extract.regen_answers): SGLang's native /generate with
the target's own prompt ids, requests in flight together, refusals and retries counted per turn,
and a target launched for it that answers as the in-process ``hf`` mode does."""

from __future__ import annotations

import json

import httpx
import pytest

import eagle3.extract.regen_answers as RS
from eagle3.errors import DataError, TransientError
from eagle3.extract.conversations import Conversation
from eagle3.extract.regen import regenerate_counted
from eagle3.extract.regen_answers import Failed, Truncated


class _Tok:
    """A character tokenizer: ids are code points; the chat template joins the contents."""

    def apply_chat_template(self, msgs, tokenize=False, add_generation_prompt=True, **kw):
        return "|".join(m["content"] for m in msgs) + ("|" + kw["tag"] if "tag" in kw else "")

    def __call__(self, text, add_special_tokens=False):
        return {"input_ids": [ord(c) for c in text]}

    def decode(self, ids, skip_special_tokens=True):
        return "".join(chr(i) for i in ids if not (skip_special_tokens and i == 0))


def _mock(monkeypatch, reply):
    real = httpx.AsyncClient
    monkeypatch.setattr(httpx, "AsyncClient",
                        lambda **kw: real(transport=httpx.MockTransport(reply), **kw))


def _generate_reply(request):
    body = json.loads(request.content)
    q = "".join(chr(i) for i in body["input_ids"])
    assert body["sampling_params"] == {"temperature": 0.0, "max_new_tokens": 5}
    if q == "bad":
        return httpx.Response(400, text="context too long")
    ids = [ord(c) for c in f" to {q} "] + [0]  # the end-of-turn id, dropped by the decode
    reason = {"type": "length", "length": 5} if q == "long" else {"type": "stop", "matched": 0}
    return httpx.Response(200, json={"output_ids": ids, "meta_info": {"finish_reason": reason}})


def test_sglang_answers_are_decoded_ids_truncated_failed_or_skipped(monkeypatch):
    _mock(monkeypatch, _generate_reply)
    fn = RS.sglang_answer_fn("http://127.0.0.1:9/", _Tok(), 5, max_prompt_tokens=6)
    got = fn([[{"role": "user", "content": q}] for q in ("hi", "long", "bad", "far too long")])
    assert got[:2] == ["to hi", "to long"]
    assert not isinstance(got[0], Truncated) and isinstance(got[1], Truncated)
    assert isinstance(got[2], Failed) and "HTTP 400: context too long" in got[2].reason
    assert got[3] is None  # 12 prompt tokens > 6: not sent, skipped as prompt_too_long


def test_the_template_switches_reach_the_prompt_ids(monkeypatch):
    _mock(monkeypatch, _generate_reply)
    got = RS.sglang_answer_fn("http://127.0.0.1:9", _Tok(), 5, template_kwargs={"tag": "T"})(
        [[{"role": "user", "content": "q"}]])
    assert got == ["to q|T"]


def test_a_batch_is_in_flight_at_once(monkeypatch):
    """The server answers only once all four requests have arrived: sent one after another they
    could not all arrive, and the wait would time out."""
    import asyncio

    arrived, everyone = [], asyncio.Event()

    async def reply(request):
        arrived.append(request)
        if len(arrived) == 4:
            everyone.set()
        await asyncio.wait_for(everyone.wait(), timeout=10)
        return _generate_reply(request)

    _mock(monkeypatch, reply)
    got = RS.sglang_answer_fn("http://127.0.0.1:9", _Tok(), 5)(
        [[{"role": "user", "content": str(i)}] for i in range(4)])
    assert got == [f"to {i}" for i in range(4)]


def test_server_errors_are_retried_then_transient_and_other_statuses_are_data_errors(
        monkeypatch):
    calls = []

    async def no_wait(s):
        calls.append(("sleep", s))

    monkeypatch.setattr(RS.asyncio, "sleep", no_wait)

    def reply(request):
        calls.append("post")
        q = "".join(chr(i) for i in json.loads(request.content)["input_ids"])
        if q == "flaky" and calls.count("post") == 1:
            return httpx.Response(503, text="warming")
        if q == "down":
            return httpx.Response(500, text="boom")
        if q == "nowhere":
            return httpx.Response(404, text="no route")
        if q == "odd":
            return httpx.Response(200, json={"meta_info": {}})
        return _generate_reply(request)

    _mock(monkeypatch, reply)
    fn = RS.sglang_answer_fn("http://127.0.0.1:9", _Tok(), 5)
    assert fn([[{"role": "user", "content": "flaky"}]]) == ["to flaky"]
    assert calls == ["post", ("sleep", 1), "post"]
    with pytest.raises(TransientError, match="HTTP 500 .3 attempts"):
        fn([[{"role": "user", "content": "down"}]])
    with pytest.raises(DataError, match="expected HTTP 200, got 404: no route"):
        fn([[{"role": "user", "content": "nowhere"}]])
    with pytest.raises(DataError, match="expected an object with 'output_ids' .a list"):
        fn([[{"role": "user", "content": "odd"}]])


def test_a_turn_whose_requests_keep_failing_stops_naming_its_conversation(monkeypatch):
    async def no_wait(s):
        return None

    monkeypatch.setattr(RS.asyncio, "sleep", no_wait)
    _mock(monkeypatch, lambda request: httpx.Response(500, text="boom")
          if "down" in "".join(chr(i) for i in json.loads(request.content)["input_ids"])
          else _generate_reply(request))
    convs = [Conversation(q, [{"role": "user", "content": q},
                              {"role": "assistant", "content": "old"}]) for q in ("ok", "down")]
    with pytest.raises(TransientError, match=r"HTTP 500 \(3 attempts\), asking assistant turn 1 "
                                             r"of conversation 'down'"):
        regenerate_counted(convs, RS.sglang_answer_fn("http://x", _Tok(), 5), 8)


def test_refused_turns_are_counted_as_failed_and_keep_their_original_answer(monkeypatch):
    _mock(monkeypatch, _generate_reply)
    convs = [Conversation(q, [{"role": "user", "content": q},
                              {"role": "assistant", "content": "old"}]) for q in ("bad", "ok")]
    out, counts = regenerate_counted(convs, RS.sglang_answer_fn("http://x", _Tok(), 5), 8)
    assert [c.messages[1]["content"] for c in out] == ["old", "to ok"]
    t = counts["turns"]
    assert (t["input"], t["succeeded"], t["failed"], t["skipped"]) == (2, 1, 1, 0)
    assert "bad turn 1: HTTP 400" in counts["failed_examples"][0]


def test_openai_prompts_over_the_limit_are_not_sent_and_switches_travel(monkeypatch):
    seen = []

    def reply(request):
        body = json.loads(request.content)
        seen.append(body)
        return httpx.Response(200, json={"choices": [{"message": {"content": "fine"},
                                                      "finish_reason": "stop"}]})

    _mock(monkeypatch, reply)
    fn = RS.openai_answer_fn("http://127.0.0.1:9/v1", None, 4, tokenizer=_Tok(),
                             template_kwargs={"tag": "T"}, max_prompt_tokens=6)
    assert fn([[{"role": "user", "content": q}] for q in ("ok", "much too long")]) == ["fine", None]
    assert len(seen) == 1 and seen[0]["chat_template_kwargs"] == {"tag": "T"}


def test_openai_without_a_url_is_refused(tiny_cfg, tmp_path):
    from eagle3.errors import ConfigError

    cfg = tiny_cfg.model_copy(update={"data": tiny_cfg.data.model_copy(
        update={"regenerate": "openai"})})
    with pytest.raises(ConfigError, match="data.regenerate_url: required"):
        with RS.answer_source(cfg, tmp_path, _Tok(), tmp_path / "logs"):
            pass


@pytest.mark.slow
def test_a_launched_target_regenerates_as_the_hf_mode_does(tiny_cfg, tmp_path):
    """``data.regenerate=sglang`` without a URL launches the target (here the reference engine,
    which speaks SGLang's /generate) with no draft behind the readiness gate, and its greedy
    answers are the in-process ``hf`` mode's, word for word; the server is gone afterwards."""
    from eagle3.extract.regen import regenerate_file
    from tests.unit.test_extract import file_cfg, write_convs

    src = write_convs(tmp_path / "c.jsonl", 4)
    common = dict(n=3, regenerate_max_new_tokens=6, regenerate_max_rounds=2,
                  regenerate_batch_size=3,
                  # a random target's answers often decode to nothing: left out, not a stop
                  regenerate_max_failed_share=1.0)
    cfg = file_cfg(tiny_cfg, src, regenerate="hf", **common)
    m_hf = regenerate_file(cfg, tmp_path / "hf.jsonl", progress=False)
    cfg = file_cfg(tiny_cfg, src, regenerate="sglang", **common)
    cfg.serve.engine = "reference"
    m_srv = regenerate_file(cfg, tmp_path / "srv.jsonl", progress=False)
    assert (tmp_path / "hf.jsonl").read_text() == (tmp_path / "srv.jsonl").read_text()
    assert m_srv["settings"]["mode"] == "sglang"
    assert m_srv["regeneration"]["turns"] == m_hf["regeneration"]["turns"]
    logs = list((tmp_path / "srv.server").glob("engine-*.log"))
    assert logs, "the launched server's log is kept beside the output"
    assert not _live_engines(), "the launched server outlived the regeneration"


def _live_engines() -> list[int]:
    """This test process's descendants running the reference engine, zombies left out."""
    import psutil

    out = []
    for p in psutil.Process().children(recursive=True):
        try:
            if p.status() != psutil.STATUS_ZOMBIE and "refengine" in " ".join(p.cmdline()):
                out.append(p.pid)
        except psutil.NoSuchProcess:
            pass
    return out


def test_aborted_and_malformed_answers_fail_instead_of_passing_as_empty(monkeypatch):
    def reply(request):
        q = "".join(chr(i) for i in json.loads(request.content)["input_ids"])
        if q == "abort":
            return httpx.Response(200, json={"text": "", "meta_info": {"finish_reason": {
                "type": "abort", "message": "prompt too long"}}})
        return httpx.Response(200, json={"text": 42, "meta_info": {}})

    _mock(monkeypatch, reply)
    fn = RS.sglang_answer_fn("http://127.0.0.1:9", _Tok(), 5)
    got = fn([[{"role": "user", "content": "abort"}]])[0]
    assert isinstance(got, Failed) and got.reason == "aborted by the server: prompt too long"
    with pytest.raises(DataError, match=r"'text' \(a string\), got .\{'text': 42"):
        fn([[{"role": "user", "content": "number"}]])


def test_the_first_error_cancels_the_requests_still_open(monkeypatch):
    """One request is answered 404 at once while three others would hang for a minute: the
    error comes back within seconds, not after the slow ones."""
    import asyncio
    import time

    async def reply(request):
        q = "".join(chr(i) for i in json.loads(request.content)["input_ids"])
        if q == "nowhere":
            await asyncio.sleep(0.2)
            return httpx.Response(404, text="no route")
        await asyncio.sleep(60)
        return _generate_reply(request)

    _mock(monkeypatch, reply)
    t0 = time.monotonic()
    with pytest.raises(DataError, match="got 404"):
        RS.sglang_answer_fn("http://127.0.0.1:9", _Tok(), 5)(
            [[{"role": "user", "content": q}] for q in ("a", "b", "nowhere", "c")])
    assert time.monotonic() - t0 < 10


def test_requests_still_open_are_named_while_waiting(monkeypatch, caplog):
    import asyncio

    async def reply(request):
        await asyncio.sleep(0.6)
        return _generate_reply(request)

    monkeypatch.setattr(RS, "OPEN_NOTE_S", 0.2)
    _mock(monkeypatch, reply)
    with caplog.at_level("WARNING"):
        got = RS.sglang_answer_fn("http://user:secret@127.0.0.1:9", _Tok(), 5, timeout_s=30)(
            [[{"role": "user", "content": "slow"}]])
    assert got == ["to slow"]
    notes = [r.getMessage() for r in caplog.records if "still open" in r.getMessage()]
    assert notes and "1 of 1 requests at http://127.0.0.1:9/generate still open" in notes[0]
    assert "data.regenerate_timeout_s=30" in notes[0] and "secret" not in notes[0]


def test_a_native_url_ending_in_v1_gets_a_hint(monkeypatch):
    _mock(monkeypatch, lambda request: httpx.Response(404, text="Not Found"))
    with pytest.raises(DataError, match=r"got 404: Not Found \(SGLang's native API is at the "
                       r"server's root: drop /v1 from data.regenerate_url\)"):
        RS.sglang_answer_fn("http://127.0.0.1:9/v1", _Tok(), 5)([[{"role": "user",
                                                                  "content": "q"}]])


def test_openai_asks_the_server_for_its_model_name(monkeypatch):
    names = []

    def reply(request):
        if request.url.path.endswith("/models"):
            return httpx.Response(200, json={"data": [{"id": "served-model"}]})
        names.append(json.loads(request.content)["model"])
        return httpx.Response(200, json={"choices": [{"message": {"content": "x"}}]})

    _mock(monkeypatch, reply)
    real_get = httpx.get
    monkeypatch.setattr(httpx, "get", lambda url, **kw: httpx.Client(
        transport=httpx.MockTransport(reply)).get(url, **kw))
    fn = RS.openai_answer_fn("http://127.0.0.1:9/v1", None, 4)
    assert fn([[{"role": "user", "content": "q"}]] * 2) == ["x", "x"]
    assert names == ["served-model", "served-model"] and real_get is not httpx.get


def test_regenerate_file_refuses_to_write_over_its_source_before_any_work(tiny_cfg, tmp_path):
    from eagle3.errors import ConfigError
    from eagle3.extract.regen import regenerate_file
    from tests.unit.test_extract import file_cfg, write_convs

    src = write_convs(tmp_path / "c.jsonl", 4)
    before = src.read_bytes()
    cfg = file_cfg(tiny_cfg, src, n=3, regenerate="sglang", regenerate_url="http://127.0.0.1:9")
    with pytest.raises(ConfigError, match="expected a file other than the source, got the source"):
        regenerate_file(cfg, src, progress=False)
    with pytest.raises(ConfigError, match="got a folder"):
        regenerate_file(cfg, tmp_path, progress=False)
    assert src.read_bytes() == before


def test_a_server_serving_another_model_is_warned_about(monkeypatch, caplog, tmp_path):
    def reply(request):
        return httpx.Response(200, json={"model_path": "/models/Other-7B"})

    monkeypatch.setattr(httpx, "get", lambda url, **kw: httpx.Client(
        transport=httpx.MockTransport(reply)).get(url, **kw))
    with caplog.at_level("INFO"):
        RS._check_served_model("http://127.0.0.1:9", tmp_path / "SmolLM2-135M-Instruct")
        RS._check_served_model("http://127.0.0.1:9", tmp_path / "Other-7B")
    warned = [r for r in caplog.records if r.levelname == "WARNING"]
    assert len(warned) == 1 and "serves '/models/Other-7B', but the target is" in \
        warned[0].getMessage()


def test_a_regeneration_url_without_a_scheme_is_refused_at_load():
    from eagle3.config import load_config
    from eagle3.errors import ConfigError

    with pytest.raises(ConfigError, match=r"data.regenerate_url: .*expected a URL starting with "
                       r"http:// or https://"):
        load_config(None, ["data.regenerate=sglang", "data.regenerate_url=127.0.0.1:9"])


def test_a_server_conversation_goes_on_without_waiting_for_the_others(monkeypatch):
    """B's first answer comes only once A's second turn has been asked: with rounds (every
    first turn answered before any second one) that would never happen; conversations side by
    side finish, and each turn still sees the conversation's regenerated earlier turns."""
    import asyncio

    a_second = asyncio.Event()

    async def reply(request):
        q = "".join(chr(i) for i in json.loads(request.content)["input_ids"])
        if q.startswith("a1|"):
            a_second.set()
        if q == "b1":
            await asyncio.wait_for(a_second.wait(), timeout=10)
        return httpx.Response(200, json={"output_ids": [ord(c) for c in f"<{q}>"],
                                         "meta_info": {"finish_reason": {"type": "stop"}}})

    _mock(monkeypatch, reply)
    convs = [Conversation("A", [{"role": "user", "content": "a1"},
                                {"role": "assistant", "content": "old"},
                                {"role": "user", "content": "a2"},
                                {"role": "assistant", "content": "old"}]),
             Conversation("B", [{"role": "user", "content": "b1"},
                                {"role": "assistant", "content": "old"}])]
    seen = []
    out, counts = regenerate_counted(convs, RS.sglang_answer_fn("http://x", _Tok(), 5), 8,
                                     on_batch=seen.append)
    assert [m["content"] for m in out[0].messages] == ["a1", "<a1>", "a2", "<a1|<a1>|a2>"]
    assert out[1].messages[1]["content"] == "<b1>" and sum(seen) == 3
    assert counts["turns"]["succeeded"] == 3 and counts["per_turn"][1]["succeeded"] == 1


def test_openai_aborted_filtered_or_contentless_answers_fail(monkeypatch):
    def reply(request):
        if request.url.path.endswith("/models"):
            return httpx.Response(200, json={"data": []})
        q = json.loads(request.content)["messages"][-1]["content"]
        choice = {"abort": {"message": {"content": "half"}, "finish_reason": "abort"},
                  "filter": {"message": {"content": ""}, "finish_reason": "content_filter"},
                  "null": {"message": {"content": None}, "finish_reason": "stop"},
                  "ok": {"message": {"content": " fine "}, "finish_reason": "stop"}}[q]
        return httpx.Response(200, json={"choices": [choice]})

    _mock(monkeypatch, reply)
    monkeypatch.setattr(httpx, "get", lambda url, **kw: httpx.Client(
        transport=httpx.MockTransport(reply)).get(url, **kw))
    got = RS.openai_answer_fn("http://127.0.0.1:9/v1", None, 4)(
        [[{"role": "user", "content": q}] for q in ("abort", "filter", "null", "ok")])
    assert [g.reason for g in got[:3]] == ["finish_reason 'abort'",
                                          "finish_reason 'content_filter'",
                                          "no message content (finish_reason 'stop')"]
    assert got[3] == "fine"


def test_urls_with_an_impossible_port_are_refused_and_the_scheme_case_is_free():
    from eagle3.config import load_config
    from eagle3.errors import ConfigError

    with pytest.raises(ConfigError, match=r"data.regenerate_url: .*port in 0-65535"):
        load_config(None, ["data.regenerate=sglang", "data.regenerate_url=http://127.0.0.1:99999"])
    cfg = load_config(None, ["data.regenerate=sglang", "data.regenerate_url=HTTP://127.0.0.1:9"])
    assert cfg.data.regenerate_url == "HTTP://127.0.0.1:9"


def test_a_launched_servers_engine_and_dtype_are_regeneration_settings(tiny_cfg, tmp_path):
    from eagle3.extract.regen import answer_settings

    cfg = tiny_cfg.model_copy(update={"data": tiny_cfg.data.model_copy(
        update={"regenerate": "sglang"})})
    a = answer_settings(cfg, tmp_path)
    cfg.serve.dtype = "bfloat16"
    b = answer_settings(cfg, tmp_path)
    assert a["served_by"]["dtype"] != b["served_by"]["dtype"]
    with_url = cfg.model_copy(update={"data": cfg.data.model_copy(
        update={"regenerate_url": "http://u:p@127.0.0.1:9"})})
    got = answer_settings(with_url, tmp_path)
    assert "served_by" not in got and got["url"] == "http://127.0.0.1:9"


def test_regenerate_file_refuses_an_out_whose_progress_file_is_the_source(tiny_cfg, tmp_path):
    from eagle3.errors import ConfigError
    from eagle3.extract.regen import regenerate_file
    from tests.unit.test_extract import file_cfg, write_convs

    src = write_convs(tmp_path / "set.chunks.jsonl", 4)
    cfg = file_cfg(tiny_cfg, src, n=3, regenerate="sglang", regenerate_url="http://127.0.0.1:9")
    with pytest.raises(ConfigError, match="the file its progress would be kept in"):
        regenerate_file(cfg, tmp_path / "set.jsonl", progress=False)
