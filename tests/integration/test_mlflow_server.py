"""The model version page of a registered draft loads from a real MLflow server (SQLite backend,
proxied artifacts, as ``make stack-up`` runs it): the UI's
``model-versions/get-artifact?path=MLmodel`` request used to fail with HTTP 500 (a ``runs:/`` source
the server resolves with its own SQLite tracking URI)."""

from __future__ import annotations

import httpx
import pytest

pytest.importorskip("mlflow")

from tasks.registry import model_name, register_draft  # noqa: E402
from testkit.mlflow_server import mlflow_server  # noqa: E402
from tests.unit.test_registry import _fig, _parent, _stage_dirs  # noqa: E402


def test_model_version_files_served_by_a_tracking_server(tiny_cfg, tiny_target_dir, tmp_path):
    with mlflow_server(tmp_path / "server") as url:
        cfg = tiny_cfg.model_copy(deep=True)
        cfg.tracking.mlflow_uri = url
        serving, train = _stage_dirs(tmp_path, "a", b"weights-a")
        parent = _parent(cfg)
        reg = register_draft(cfg, serving, train, _fig(1.4, 1.42, 1.5), parent)
        assert reg.name == model_name(tiny_target_dir.name) and reg.source.startswith(
            "mlflow-artifacts:/"
        )
        files = {}
        for path in (
            "MLmodel",
            "config.json",
        ):  # what the model version page and its artifact view request
            r = httpx.get(
                f"{url}/model-versions/get-artifact",
                params={"path": path, "name": reg.name, "version": reg.version},
                timeout=30,
            )
            assert r.status_code == 200, (path, r.status_code, r.text[:300])
            files[path] = r.text
        assert "eagle3_draft" in files["MLmodel"] and serving.content_hash in files["MLmodel"]
        assert "LlamaForCausalLMEagle3" in files["config.json"]
        # the version page's own API call, and the parent run it belongs to
        mv = httpx.get(
            f"{url}/ajax-api/2.0/mlflow/model-versions/get",
            params={"name": reg.name, "version": reg.version},
            timeout=30,
        ).json()["model_version"]
        assert mv["run_id"] == parent and mv["status"] == "READY"
