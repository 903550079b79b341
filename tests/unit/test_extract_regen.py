"""Regeneration of assistant turns by the target (HF generate) or an OpenAI-compatible endpoint."""

from __future__ import annotations

import json
import threading
from http.server import HTTPServer

import pytest
import torch

from eagle3.extract.conversations import Conversation
from eagle3.errors import DataError, TransientError
from eagle3.extract.stage import extract
from eagle3.extract.regen import regenerate_counted
from eagle3.extract.regen_answers import hf_answer_fn, openai_answer_fn
from tests.support.handover import JsonHandler
from tests.unit.test_extract import file_cfg, write_convs

TWO_TURNS = Conversation(
    "t",
    [
        {"role": "user", "content": "a"},
        {"role": "assistant", "content": "old1"},
        {"role": "user", "content": "b"},
        {"role": "assistant", "content": "old2"},
    ],
)


def _regenerate(convs, answer_fn, batch_size, max_rounds=None, on_batch=None):
    """The regenerated conversations without their counts."""
    return regenerate_counted(convs, answer_fn, batch_size, max_rounds, on_batch)[0]


def test_regenerate_round_by_round_with_regenerated_history():
    seen = []

    def fake(prefixes):
        seen.extend(json.dumps(p) for p in prefixes)
        return [f"new{len(p)}" for p in prefixes]

    out = _regenerate([TWO_TURNS, Conversation("x", text="plain")], fake, batch_size=4)
    assert [m["content"] for m in out[0].messages] == ["a", "new1", "b", "new3"]
    assert out[1].text == "plain" and TWO_TURNS.messages[1]["content"] == "old1"  # input untouched
    assert '"content": "new1"' in seen[1]  # the second turn saw the regenerated first one


@pytest.mark.slow
def test_hf_regeneration_in_extraction(tiny_cfg, tiny_target_dir, tmp_path):
    from transformers import AutoTokenizer

    from eagle3.target_model import load_target

    cfg = file_cfg(
        tiny_cfg,
        write_convs(tmp_path / "c.jsonl", 3),
        n=3,
        regenerate="hf",
        regenerate_max_new_tokens=6,
        # a random target's answers often decode to nothing: left out, not a stop
        regenerate_max_failed_share=1.0,
    )
    out = tmp_path / "o"
    m = extract(cfg, out, progress=False)
    assert m["regenerated"] == "hf"
    cache = list((out / ".progress").glob("regenerated-*.jsonl"))
    assert len(cache) == 1
    recs = [json.loads(x) for x in cache[0].read_text().splitlines()]
    assert all(not r["messages"][1]["content"].startswith("answer") for r in recs)
    model, tok = load_target(tiny_target_dir, "float32", "cpu")
    alone = hf_answer_fn(model, tok, 6)([recs[0]["messages"][:1]])[0]
    assert alone == recs[0]["messages"][1]["content"]
    import datasets

    row = datasets.load_from_disk(str(out / "data"))[0]
    tk = AutoTokenizer.from_pretrained(tiny_target_dir)
    masked = tk.decode(row["input_ids"][row["loss_mask"].bool()])
    assert (
        masked
        == recs[[r["id"] for r in recs].index(row["id"])]["messages"][1]["content"] + "<|im_end|>"
    )
    # the regeneration's counts are in the extraction manifest, as in the sidecar
    from eagle3.extract.regen import counts_path

    turns = m["regeneration"]["turns"]
    assert turns["input"] == 3 and turns["succeeded"] + turns["failed"] + turns["skipped"] == 3
    assert m["regeneration"] == json.loads(counts_path(cache[0]).read_text())
    assert m["regeneration"]["settings"]["mode"] == "hf"
    # one turn a conversation: those left with an empty answer are not written, nor counted
    assert m["regeneration"]["repetition"]["answers"] == (3 - turns["failed"] - turns["skipped"]
                                                          - turns["empty"])
    # a resumed / repeated run reuses the cache (same content hash, no second generation)
    assert extract(cfg, out, progress=False)["content_hash"] == m["content_hash"]


class _Handler(JsonHandler):
    def do_POST(self):  # noqa: N802 - http.server API
        body = json.loads(self.rfile.read(int(self.headers["Content-Length"])))
        last = body["messages"][-1]["content"]
        code = 500 if last == "boom" else 404 if last == "missing" else 200
        self.send_json(code, {"choices": [
            {"message": {"role": "assistant", "content": f" echo:{last}:{body['max_tokens']} "}}
        ]})


@pytest.fixture
def endpoint():
    server = HTTPServer(("127.0.0.1", 0), _Handler)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    yield f"http://127.0.0.1:{server.server_address[1]}/v1"
    server.shutdown()
    thread.join(timeout=10)


def test_openai_endpoint_regeneration(endpoint):
    fn = openai_answer_fn(endpoint, "m", 7, timeout_s=10)
    out = _regenerate([TWO_TURNS], fn, batch_size=2)
    assert [m["content"] for m in out[0].messages] == ["a", "echo:a:7", "b", "echo:b:7"]
    with pytest.raises(TransientError, match="HTTP 500"):
        fn([[{"role": "user", "content": "boom"}]])
    with pytest.raises(DataError, match="expected HTTP 200, got 404"):
        fn([[{"role": "user", "content": "missing"}]])


def test_max_rounds_regenerates_the_first_turns_and_drops_the_rest():
    calls = []

    def fake(prefixes):
        calls.append(len(prefixes))
        return [f"new{len(p)}" for p in prefixes]

    out = _regenerate([TWO_TURNS], fake, batch_size=4, max_rounds=1)
    assert [m["content"] for m in out[0].messages] == [
        "a",
        "new1",
    ]  # the later turn answered the old reply
    assert calls == [1]


def test_a_too_long_prompt_keeps_its_original_answer_and_wrong_answer_counts_are_refused():
    out = _regenerate([TWO_TURNS], lambda ps: [None for _ in ps], batch_size=2)
    assert [m["content"] for m in out[0].messages] == ["a", "old1", "b", "old2"]
    with pytest.raises(DataError, match="expected 1 answers for a batch, got 0"):
        _regenerate([TWO_TURNS], lambda ps: [], batch_size=2)


def test_batches_are_ordered_by_prompt_length():
    convs = [
        Conversation(
            str(i), [{"role": "user", "content": "x" * n}, {"role": "assistant", "content": "o"}]
        )
        for i, n in enumerate([50, 5, 500, 10])
    ]
    batches = []
    _regenerate(
        convs,
        lambda ps: batches.append([len(p[0]["content"]) for p in ps]) or ["n"] * len(ps),
        batch_size=2,
    )
    assert batches == [[5, 10], [50, 500]]


@pytest.mark.slow
def test_regenerate_file_writes_shared_conversations_and_a_manifest(
    tiny_cfg, tiny_target_dir, tmp_path
):
    from eagle3.extract.conversations import read_conversations
    from eagle3.extract.regen import regenerate_file

    cfg = file_cfg(
        tiny_cfg,
        write_convs(tmp_path / "c.jsonl", 4),
        n=3,
        regenerate="hf",
        regenerate_max_new_tokens=5,
        regenerate_max_rounds=1,
        regenerate_batch_size=2,
        # a random target's answers often decode to nothing: left out, not a stop
        regenerate_max_failed_share=1.0,
    )
    m = regenerate_file(cfg, tmp_path / "regen.jsonl", progress=False)
    kept = 3 - m["counts"]["unanswered_left_out"]  # answers that decoded to nothing: left out
    assert m["kind"] == "regenerated_conversations" and m["counts"]["conversations"] == kept
    assert m["settings"]["max_rounds"] == 1 and m["counts"]["answers"] == kept >= 1
    assert m["selection"] == {"asked": 3, "selected": 3, "skipped_by_reason": {}}
    convs, stats = read_conversations(tmp_path / "regen.jsonl")
    assert len(convs) == kept and all(c.messages[-1]["role"] == "assistant" for c in convs)
    assert all(not c.messages[1]["content"].startswith("answer") for c in convs)
    assert json.loads((tmp_path / "regen.jsonl.manifest.json").read_text())["sha256"] == m["sha256"]
    with pytest.raises(Exception, match=r"expected one of \['hf', 'sglang', 'openai'\]"):
        regenerate_file(
            file_cfg(tiny_cfg, tmp_path / "c.jsonl", n=3), tmp_path / "x.jsonl", progress=False
        )


def test_a_batch_that_runs_out_of_device_memory_is_generated_as_two_halves(tiny_target_dir, caplog):
    from eagle3.target_model import load_target

    model, tok = load_target(tiny_target_dir, "float32", "cpu")
    prefixes = [[{"role": "user", "content": f"question {i}"}] for i in range(5)]
    want = [hf_answer_fn(model, tok, 4)([p])[0] for p in prefixes]
    real, sizes = model.generate, []

    def tight(**kw):  # a device that holds at most 2 prompts per batch
        sizes.append(kw["input_ids"].shape[0])
        if kw["input_ids"].shape[0] > 2:
            raise torch.OutOfMemoryError("CUDA out of memory (simulated)")
        return real(**kw)

    model.generate = tight
    with caplog.at_level("WARNING", logger="eagle3.extract.regen"):
        got = hf_answer_fn(model, tok, 4)(prefixes)
    assert got == want
    assert sizes == [5, 2, 3, 1, 2]  # 5 -> 2 + 3, then 3 -> 1 + 2
    assert "a batch of 5 prompts ran out of device memory" in caplog.text

    def never(**kw):
        raise torch.OutOfMemoryError("CUDA out of memory (simulated)")

    model.generate = never
    with pytest.raises(DataError, match="does not fit on the device"):
        hf_answer_fn(model, tok, 4)(prefixes[:1])


def test_regeneration_without_its_counts_file_is_recorded_as_missing(tmp_path, caplog):
    from eagle3.extract.stage import regeneration_counts

    cache = tmp_path / "regenerated-k.jsonl"
    cache.write_text("")
    with caplog.at_level("WARNING", logger="eagle3.extract.stage"):
        got = regeneration_counts(cache)
    assert got["counts"] == "missing" and "regenerated-k.jsonl.counts.json" in got["why"]
    assert "regeneration counts not recorded" in caplog.text


def test_extract_task_logs_the_regenerated_turns_to_mlflow(tmp_path, monkeypatch):
    """The extract task logs the manifest's regeneration headline as MLflow metrics and returns
    them with the stage result; an extraction without regeneration logs none."""
    from contextlib import contextmanager

    import tasks.extract as task
    from eagle3.config import load_config

    logged: dict = {}

    class Run:
        run_id = "r"

        def log_manifest(self, _d): ...

        def log_dataset(self, _d, _c): ...

        def log_metrics(self, m, step=0):
            logged.update(m)

        def set_tags(self, t): ...

    @contextmanager
    def stage_run(*_a, **_k):
        yield Run()

    turns = {"input": 7, "succeeded": 5, "failed": 1, "skipped": 1, "truncated": 2, "clean": 3}
    manifest = {"content_hash": "h", "counts": {}, "regeneration": {"turns": turns}}
    monkeypatch.setattr(task.tracking, "stage_run", stage_run)
    monkeypatch.setattr(task, "extract_superseding", lambda cfg, out: manifest)
    result = task.extract_task.fn(load_config(None, []), tmp_path, "parent")
    want = {
        f"regeneration.turns.{k}": float(turns[k])
        for k in ("input", "succeeded", "failed", "skipped", "truncated")
    }
    assert {k: v for k, v in logged.items() if k.startswith("regeneration.")} == want
    assert {k: v for k, v in result.metrics.items() if k.startswith("regeneration.")} == want
    logged.clear()
    manifest["regeneration"] = None
    task.extract_task.fn(load_config(None, []), tmp_path, "parent")
    assert not any(k.startswith("regeneration.") for k in logged)
