"""Regeneration of assistant turns by the target (HF generate) or an OpenAI-compatible endpoint."""

from __future__ import annotations

import json
import threading
from http.server import BaseHTTPRequestHandler, HTTPServer

import pytest

from eagle3.extract.conversations import Conversation
from eagle3.errors import DataError, TransientError
from eagle3.extract.stage import extract
from eagle3.extract.regen import hf_answer_fn, openai_answer_fn, regenerate
from tests.unit.test_extract import file_cfg, write_convs

TWO_TURNS = Conversation("t", [{"role": "user", "content": "a"}, {"role": "assistant", "content": "old1"},
                               {"role": "user", "content": "b"}, {"role": "assistant", "content": "old2"}])


def test_regenerate_round_by_round_with_regenerated_history():
    seen = []

    def fake(prefixes):
        seen.extend(json.dumps(p) for p in prefixes)
        return [f"new{len(p)}" for p in prefixes]

    out = regenerate([TWO_TURNS, Conversation("x", text="plain")], fake, batch_size=4)
    assert [m["content"] for m in out[0].messages] == ["a", "new1", "b", "new3"]
    assert out[1].text == "plain" and TWO_TURNS.messages[1]["content"] == "old1"  # input untouched
    assert '"content": "new1"' in seen[1]  # the second turn saw the regenerated first one


@pytest.mark.slow
def test_hf_regeneration_in_extraction(tiny_cfg, tiny_target_dir, tmp_path):
    from transformers import AutoTokenizer

    from eagle3.target_model import load_target

    cfg = file_cfg(tiny_cfg, write_convs(tmp_path / "c.jsonl", 3), n=3, regenerate="hf",
                   regenerate_max_new_tokens=6)
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
    assert masked == recs[[r["id"] for r in recs].index(row["id"])]["messages"][1]["content"] + "<|im_end|>"
    # a resumed / repeated run reuses the cache (same content hash, no second generation)
    assert extract(cfg, out, progress=False)["content_hash"] == m["content_hash"]


class _Handler(BaseHTTPRequestHandler):
    def do_POST(self):  # noqa: N802 - http.server API
        body = json.loads(self.rfile.read(int(self.headers["Content-Length"])))
        last = body["messages"][-1]["content"]
        code = 500 if last == "boom" else 404 if last == "missing" else 200
        payload = {"choices": [{"message": {"role": "assistant", "content": f" echo:{last}:{body['max_tokens']} "}}]}
        data = json.dumps(payload).encode()
        self.send_response(code)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(data)))
        self.end_headers()
        self.wfile.write(data)

    def log_message(self, *args):
        pass


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
    out = regenerate([TWO_TURNS], fn, batch_size=2)
    assert [m["content"] for m in out[0].messages] == ["a", "echo:a:7", "b", "echo:b:7"]
    with pytest.raises(TransientError, match="HTTP 500"):
        fn([[{"role": "user", "content": "boom"}]])
    with pytest.raises(DataError, match="expected HTTP 200, got 404"):
        fn([[{"role": "user", "content": "missing"}]])
