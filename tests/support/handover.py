"""Small fixtures the hand-over tests share: an HF target folder with only a config.json, a config
that points at it, the CLI through typer's runner, and an edit of a draft's config.json."""

from __future__ import annotations

import json
from http.server import BaseHTTPRequestHandler
from pathlib import Path


def hf_target(tmp_path: Path, layers: int = 8, vocab: int = 1000) -> Path:
    """``<tmp_path>/target`` holding a config.json with ``layers`` layers and ``vocab`` ids."""
    d = tmp_path / "target"
    d.mkdir()
    (d / "config.json").write_text(json.dumps({"num_hidden_layers": layers, "vocab_size": vocab}))
    return d


def target_cfg(target: Path, *overrides: str):
    """The default run config with ``target.kind hf`` at ``target`` and ``overrides``."""
    from eagle3.config import load_config

    return load_config(None, ["target.kind=hf", f"target.path={target}", *overrides])


def cli(*args):
    """``eagle3 ARGS`` through typer's test runner (a Result: exit_code, output)."""
    from typer.testing import CliRunner

    from cli.main import app

    return CliRunner().invoke(app, [str(a) for a in args])


def edit_config(d: Path, **changes) -> None:
    """Update ``d/config.json``'s top-level keys with ``changes``."""
    cfg = json.loads((d / "config.json").read_text())
    cfg.update(changes)
    (d / "config.json").write_text(json.dumps(cfg))


class JsonHandler(BaseHTTPRequestHandler):
    """A quiet request handler that answers JSON (:meth:`send_json`)."""

    def send_json(self, code: int, payload) -> None:
        data = json.dumps(payload).encode()
        self.send_response(code)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(data)))
        self.end_headers()
        self.wfile.write(data)

    def log_message(self, *args):
        pass


def loopback(handler):
    """Serve ``handler`` (a BaseHTTPRequestHandler class) on 127.0.0.1 at a free port in a daemon
    thread; returns ``(server, url)``. End it with ``server.shutdown(); server.server_close()``."""
    import threading
    from http.server import ThreadingHTTPServer

    httpd = ThreadingHTTPServer(("127.0.0.1", 0), handler)
    threading.Thread(target=httpd.serve_forever, daemon=True).start()
    return httpd, f"http://127.0.0.1:{httpd.server_address[1]}"
