"""The Prefect and MLflow UIs as a person sees them, in headless Chromium (Playwright driving
Debian's ``chromium``): the tiny-random pipeline run as a deployment on the local stack
(``infra/stack.sh up``: Prefect server, MLflow server, deployment server, on free loopback ports,
state under tmp), then a run made to fail in its benchmark (``bench.request_timeout_s=0.01``).

Asserted from the rendered pages: ``prefect deployment run --watch`` prints the MLflow parent
run id and the decision; the flow run's name carries the config name, its state message the
decision and the acceptance lengths; the summary artifact shows the acceptance lengths, the
decision and an MLflow link that opens the parent run; the parent run page shows the decision and
every acceptance length on its first screen; the MLflow run list shows distinct short rounded
acceptance columns and the decision, sized to be read; the model version page loads without an
HTTP error; the failed run's artifact names the stage, shows its error on several lines, and links
its MLflow run, whose artifacts hold the error, and its Prefect task-run log.
``make stack-down``'s script stops everything without SIGKILL.

Opt-in (minutes, three servers):
``EAGLE3_BROWSER=1 pytest -m browser tests/e2e/test_ui_browser.py``; needs
``pip install playwright`` (no browser download: it drives ``/usr/bin/chromium``).
``EAGLE3_UI_SCREENSHOTS=DIR`` also saves the screenshots there (docs/ui holds the ones the README
links).
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import httpx
import pytest

playwright = pytest.importorskip("playwright.sync_api")
pytestmark = [
    pytest.mark.browser,
    pytest.mark.slow,
    pytest.mark.skipif(os.environ.get("EAGLE3_BROWSER") != "1", reason="opt-in: EAGLE3_BROWSER=1"),
    pytest.mark.skipif(shutil.which("chromium") is None, reason="needs Debian's chromium"),
]

REPO = Path(__file__).resolve().parents[2]
TERMINAL = {"COMPLETED", "FAILED", "CRASHED", "CANCELLED"}


def _port() -> int:
    from eagle3.procs import free_port

    return free_port()


@pytest.fixture(scope="module")
def stack(tmp_path_factory):
    """The local stack of infra/stack.sh on free ports; yields (prefect API, MLflow URL, state
    dir)."""
    state = tmp_path_factory.mktemp("stack")
    env = {
        **os.environ,
        "EAGLE3_STACK_DIR": str(state),
        "PREFECT_PORT": str(_port()),
        "MLFLOW_PORT": str(_port()),
        "VENV_BIN": str(Path(sys.executable).parent),
    }
    for k in ("PREFECT_API_URL", "MLFLOW_TRACKING_URI"):
        env.pop(k, None)
    up = subprocess.run(
        ["infra/stack.sh", "up"], cwd=REPO, env=env, capture_output=True, text=True, timeout=600
    )
    try:
        assert up.returncode == 0, up.stdout[-3000:] + up.stderr[-3000:]
        yield (
            f"http://127.0.0.1:{env['PREFECT_PORT']}/api",
            f"http://127.0.0.1:{env['MLFLOW_PORT']}",
            state,
        )
    finally:
        down = subprocess.run(
            ["infra/stack.sh", "down"],
            cwd=REPO,
            env=env,
            capture_output=True,
            text=True,
            timeout=180,
        )
        print(down.stdout, down.stderr)
    # stopped in order, each on SIGTERM: no SIGKILL, no traceback from the deployment server
    assert down.returncode == 0 and "killing" not in down.stdout, down.stdout
    log = (
        state / "serve.log"
    ).read_text()  # (the failed run's own traceback is before the shutdown)
    assert "SIGTERM received" in log and "Traceback" not in log.split("SIGTERM received")[-1], log[
        -3000:
    ]


def _run_deployment(api: str, overrides: list[str], timeout_s: float = 900) -> dict:
    """Run ``eagle3-pipeline/tiny-random`` through the Prefect API; return the finished flow run."""
    deadline = time.monotonic() + 120  # the deployment server registers them right after it says so
    while (
        r := httpx.get(f"{api}/deployments/name/eagle3-pipeline/tiny-random", timeout=30)
    ).status_code == 404:
        assert time.monotonic() < deadline, r.text
        time.sleep(2)
    dep = r.json()
    fr = httpx.post(
        f"{api}/deployments/{dep['id']}/create_flow_run",
        timeout=30,
        json={"parameters": {"config_path": "configs/tiny-random.yaml", "overrides": overrides}},
    ).json()
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        run = httpx.get(f"{api}/flow_runs/{fr['id']}", timeout=30).json()
        if run["state_type"] in TERMINAL:
            return run
        time.sleep(3)
    raise AssertionError(f"flow run {fr['id']} not finished after {timeout_s}s")


def _run_deployment_cli(api: str, overrides: list[str], timeout_s: float = 900) -> tuple[dict, str]:
    """``prefect deployment run eagle3-pipeline/tiny-random --watch`` as a user types it; return the
    finished flow run and what the command printed."""
    import json
    import re

    env = {**os.environ, "PREFECT_API_URL": api, "COLUMNS": "200"}
    deadline = time.monotonic() + 120  # the deployment server registers them right after it says so
    url = f"{api}/deployments/name/eagle3-pipeline/tiny-random"
    while httpx.get(url, timeout=30).status_code == 404:
        assert time.monotonic() < deadline
        time.sleep(2)
    cmd = [
        str(Path(sys.executable).parent / "prefect"),
        "deployment",
        "run",
        "eagle3-pipeline/tiny-random",
        "--param",
        "config_path=configs/tiny-random.yaml",
        "--param",
        f"overrides={json.dumps(overrides)}",
        "--watch",
    ]
    out = subprocess.run(cmd, cwd=REPO, env=env, capture_output=True, text=True, timeout=timeout_s)
    text = out.stdout + out.stderr
    fr_id = re.search(r"UUID: ([0-9a-f-]{36})", text)
    assert fr_id, text[-3000:]
    return httpx.get(f"{api}/flow_runs/{fr_id.group(1)}", timeout=30).json(), text


def _artifact(api: str, flow_run_id: str, key: str) -> dict:
    arts = httpx.post(
        f"{api}/artifacts/filter",
        timeout=30,
        json={"artifacts": {"flow_run_id": {"any_": [flow_run_id]}, "key": {"any_": [key]}}},
    ).json()
    assert len(arts) == 1, arts
    return arts[0]


class Browser:
    """One headless Chromium; pages recorded with their HTTP errors; screenshots kept in
    ``shots``."""

    def __init__(self, pw, shots: Path):
        self.browser = pw.chromium.launch(
            executable_path=shutil.which("chromium"), args=["--no-sandbox"]
        )
        self.ctx = self.browser.new_context(viewport={"width": 1280, "height": 800})
        # MLflow's assistant panel opens on a first visit and would cover half of every screenshot
        self.ctx.add_init_script(
            "localStorage.setItem('mlflow.assistant.panelOpen_v1', 'false');"
            "localStorage.setItem('mlflow.assistant.fab.autoOpenedOnFirstLoad_v1', 'true')"
        )
        self.shots, self.errors = shots, []

    def open(self, url: str, wait_for: str, shot: str | None = None):
        page = self.ctx.new_page()
        page.on(
            "response", lambda r: self.errors.append((r.status, r.url)) if r.status >= 500 else None
        )
        page.goto(url)
        try:
            page.get_by_text(wait_for).first.wait_for(timeout=60_000)
        except Exception:  # what the page showed instead, kept beside the screenshots
            page.screenshot(path=str(self.shots / f"not-found-{shot or 'page'}.png"))
            raise
        page.wait_for_timeout(1500)  # late tables and charts
        if shot:  # 128-colour PNG: a third of the bytes, the text as sharp
            from PIL import Image

            path = self.shots / f"{shot}.png"
            page.screenshot(path=str(path))
            Image.open(path).convert("RGB").quantize(colors=128).save(path, optimize=True)
        return page


def test_ui_shows_the_run_and_the_failure(stack, tmp_path):
    api, mlflow, _ = stack
    shots = Path(os.environ.get("EAGLE3_UI_SCREENSHOTS") or tmp_path / "shots")
    shots.mkdir(parents=True, exist_ok=True)
    short = Path(tempfile.mkdtemp(prefix="e3ui-"))  # the override is part of the flow run's name
    runs = f"paths.runs_dir={short}"
    ok, printed = _run_deployment_cli(api, [runs])
    assert ok["state_type"] == "COMPLETED", ok["state"]
    # what a `prefect deployment run --watch` user sees: the parent run id and the decision
    head = "MLflow parent run "
    parent = printed.split(head, 1)[1].split()[0] if head in printed else ""
    assert len(parent) == 32 and f"eagle3 decide {parent}" in printed, printed[-3000:]
    message = ok["state"]["message"]
    assert message.startswith("decision: ") and "AL served " in message, message
    assert parent in message, message
    bad = _run_deployment(api, [runs, "bench.request_timeout_s=0.01"])
    assert bad["state_type"] == "FAILED"
    ui = api.removesuffix("/api")
    with playwright.sync_playwright() as pw:
        b = Browser(pw, shots)
        # Prefect: the flow run's name carries the config name (and the overrides)
        # ... and its log (the page's first tab) starts with the MLflow parent run's id
        page = b.open(
            f"{ui}/runs/flow-run/{ok['id']}", f"MLflow parent run {parent}", "prefect-flow-run"
        )
        assert ok["name"].startswith("tiny-random-") and page.title().startswith(
            f"Flow Run: {ok['name']}"
        )
        # the extraction's own warning is in the task-run logs
        assert page.get_by_text("records skipped").count() >= 1
        # the summary artifact: acceptance lengths, decision, a working MLflow link
        art = _artifact(api, ok["id"], "eagle3-tiny-random")
        page = b.open(
            f"{ui}/artifacts/artifact/{art['id']}",
            "served, trained draft",
            "prefect-summary-artifact",
        )
        text = page.inner_text("body")
        for want in (
            "Decision:",
            "served, untrained baseline",
            "offline, same draft and prompts",
            "acceptance-gate",
            "register-draft",
        ):
            assert want in text, want
        link = page.get_by_role("link", name="tiny-random (").get_attribute("href")
        runs_link = page.locator("a[href*='viewStateShareKey']").first.get_attribute("href")
        assert link.startswith(f"{mlflow}/#/experiments/")
        # ... which opens the parent run, whose description shows the decision
        page = b.open(link, "AL = acceptance length", "mlflow-parent-run")
        assert "acceptance length (bonus token counted)" in page.inner_text("body")
        # the decision and every acceptance length, labelled, on the first screen (not folded)
        for text in ("; AL ", "AL = acceptance length"):
            first = page.get_by_text(text).first
            assert first.is_visible() and first.bounding_box()["y"] < 800, text
        assert "offline" in page.get_by_text("AL = acceptance length").first.inner_text()
        # the run list, through the artifact's experiment link: distinct short acceptance columns,
        # rounded, and the decision, readable, on the first screen
        page = b.open(runs_link, "AL untrained", "mlflow-run-list")
        text = page.inner_text("body")
        for want in (
            "AL served",
            "AL untrained",
            "AL offline",
            "eagle3.decision",
            "more evidence needed",
        ):
            assert want in text, want
        # the view's column order and widths are applied: titles and the decision readable
        widths = dict(
            page.eval_on_selector_all(
                ".ag-header-cell", "els => els.map(e => [e.getAttribute('col-id'), e.offsetWidth])"
            )
        )
        from tasks.mlflow_ui import COLUMN_WIDTHS

        assert all(widths.get(k) == w for k, w in COLUMN_WIDTHS.items() if k in widths), widths
        heads = [k for k in widths if k.startswith("metrics.")]
        assert heads == ["metrics.`AL served`", "metrics.`AL untrained`", "metrics.`AL offline`"], (
            heads
        )
        decision = page.locator(".ag-cell[col-id='tags.`eagle3.decision`']").nth(1)  # the good run
        assert decision.is_visible() and decision.bounding_box()["x"] + 170 <= 1280
        # the model version page loads (no HTTP 5xx: it used to fail on get-artifact?path=MLmodel)
        from mlflow import MlflowClient

        mv = MlflowClient(mlflow, registry_uri=mlflow).search_model_versions(
            "name LIKE 'eagle3-draft-tiny%'"
        )[0]
        page = b.open(
            f"{mlflow}/#/models/{mv.name}/versions/{mv.version}?workflowType=machine_learning",
            "eagle3.pipeline_run_id",
            "mlflow-model-version",
        )
        assert f"Version {mv.version}" in page.inner_text("body")
        # the failed run: an artifact naming the stage, linking its MLflow run (error.txt) and its
        # log
        art = _artifact(api, bad["id"], "eagle3-tiny-random-failed")
        page = b.open(
            f"{ui}/artifacts/artifact/{art['id']}", "Failed stage", "prefect-failure-artifact"
        )
        text = page.inner_text("body")
        assert "Failed stage: deploy-bench" in text and "bench.request_timeout_s" in text
        # the error, wrapped: not cut at the page's edge
        block = page.locator("pre").first.inner_text()
        assert block.count("\n") >= 1 and max(len(x) for x in block.splitlines()) <= 80, block
        stage_run = page.locator(
            f"a[href^='{mlflow}']", has_text="deploy-bench"
        ).first.get_attribute("href")
        log = page.get_by_role("link", name="artifacts (error.txt, logs)").get_attribute("href")
        task_log = page.locator("a[href*='/runs/task-run/']").first.get_attribute("href")
        assert stage_run.startswith(mlflow) and "/runs/task-run/" in task_log
        b.open(stage_run, "deploy-bench", "mlflow-failed-stage-run")
        b.open(log, "error.txt")
        b.open(task_log, "request_timeout_s", "prefect-failed-task-log")
        assert b.errors == [], b.errors
        b.browser.close()
    shutil.rmtree(short)
