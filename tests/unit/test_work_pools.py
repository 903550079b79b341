"""Work-pool templates and prefect.yaml against the workers that run them.

The Kubernetes job template cannot run here (no cluster), so it is checked the way Prefect itself
checks it: the server's rules for a base job template (every placeholder declared),
prefect-kubernetes' job configuration (required manifest paths, compatible values) after rendering
with the template's defaults and with user values, and its flow-run preparation (the manifest a Job
would be created from). The Docker pools' templates (infra/pool_template.py, what
`make stack-up-distributed` creates) go through prefect-docker's configuration the same way.
prefect.yaml: every deployment on one of the two pools, each entrypoint loadable, its parameters
accepted.
"""

from __future__ import annotations

import asyncio
import importlib.util
import json
import uuid
from pathlib import Path

import pytest

pytest.importorskip("prefect")
prefect_kubernetes = pytest.importorskip("prefect_kubernetes")
prefect_docker = pytest.importorskip("prefect_docker")

REPO = Path(__file__).resolve().parents[2]
K8S = REPO / "infra" / "k8s-work-pool-job-template.json"


def _pool_template_module():
    spec = importlib.util.spec_from_file_location(
        "pool_template", REPO / "infra" / "pool_template.py"
    )
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


class _NoClient:
    """Stands in for a Prefect client: rendering a template without block or variable references
    needs none."""

    def __getattr__(self, name):
        raise AssertionError(
            f"the template needed the Prefect API ({name}); expected a self-contained template"
        )


def _render(config_cls, template: dict, values: dict):
    """Prefect's worker-side path: defaults + values → job configuration → prepared for a flow
    run."""
    from prefect.client.schemas.objects import FlowRun
    from prefect.utilities.schema_tools import validate

    validate(
        values, template["variables"], raise_on_error=True, preprocess=True, ignore_required=True
    )
    conf = asyncio.run(config_cls.from_template_and_values(template, values, client=_NoClient()))
    conf.prepare_for_flow_run(
        FlowRun(id=uuid.uuid4(), name="tiny-random-extract", flow_id=uuid.uuid4())
    )
    return conf


def _accepted_by_server(template: dict, pool_type: str) -> None:
    """The server's checks of a base job template (placeholders declared as variables)."""
    from prefect.client.schemas.actions import WorkPoolCreate

    WorkPoolCreate(name="eagle3-test", type=pool_type, base_job_template=template)


def test_kubernetes_template_against_the_kubernetes_worker():
    from prefect_kubernetes.worker import KubernetesWorkerJobConfiguration as K8sConf
    from prefect.utilities.templating import find_placeholders

    template = json.loads(K8S.read_text())
    _accepted_by_server(template, "kubernetes")
    fields = set(K8sConf.model_fields)
    assert set(template["job_configuration"]) <= fields, set(template["job_configuration"]) - fields
    used = {p.name for p in find_placeholders(template["job_configuration"])}
    assert used == set(template["variables"]["properties"]), "declared but unused: " + str(
        set(template["variables"]["properties"]) - used
    )

    for values, gpus in (
        ({}, 1),
        (
            {
                "gpu_count": 8,
                "image": "registry.example.com/eagle3-worker:gpu",
                "env": {"MLFLOW_TRACKING_URI": "http://mlflow.eagle3:5000"},
            },
            8,
        ),
    ):
        conf = _render(K8sConf, template, values)
        pod = conf.job_manifest["spec"]["template"]["spec"]
        (c,) = pod["containers"]
        assert (
            c["resources"]["requests"]["nvidia.com/gpu"]
            == gpus
            == c["resources"]["limits"]["nvidia.com/gpu"]
        )
        assert {m["mountPath"]: m["name"] for m in c["volumeMounts"]} == {
            "/cache": "cache",
            "/runs": "runs",
            "/dev/shm": "dshm",
        }
        claims = {
            v["name"]: v.get("persistentVolumeClaim", {}).get("claimName") for v in pod["volumes"]
        }
        assert claims == {"cache": "eagle3-cache", "runs": "eagle3-runs", "dshm": None}
        assert c["image"] == values.get("image", "eagle3-gpu-worker:latest")
        env = {e["name"]: e.get("value") for e in c["env"]}
        assert "PREFECT__FLOW_RUN_ID" in env  # the worker's own variables reach the job
        if values.get("env"):
            assert env["MLFLOW_TRACKING_URI"] == "http://mlflow.eagle3:5000"
        assert c["args"][:3] == ["prefect", "flow-run", "execute"]

    from prefect.utilities.schema_tools import ValidationError

    with pytest.raises(ValidationError):  # the schema refuses what the cluster would refuse later
        _render(K8sConf, template, {"gpu_count": -1})


def test_kubernetes_cpu_pool_template_requests_no_gpu():
    from prefect_kubernetes.worker import KubernetesWorkerJobConfiguration as K8sConf

    pt = _pool_template_module()
    template = pt.kubernetes_template(
        image="r/eagle3-worker:cpu",
        gpus=0,
        env={"A": "b"},
        namespace="ml",
        runs_pvc="runs",
        cache_pvc=None,
    )
    _accepted_by_server(template, "kubernetes")
    conf = _render(K8sConf, template, {})
    (c,) = conf.job_manifest["spec"]["template"]["spec"]["containers"]
    assert c["resources"]["requests"]["nvidia.com/gpu"] == 0 and c["image"] == "r/eagle3-worker:cpu"
    assert conf.job_manifest["metadata"]["namespace"] == "ml"
    with pytest.raises(pt.TemplateError, match=r"variables \['gpus'\]: not declared"):
        pt.set_defaults(template, {"gpus": 1})


def test_docker_pool_templates_against_the_docker_worker(tmp_path):
    import docker
    from prefect_docker.worker import DockerWorkerJobConfiguration as DockerConf

    pt = _pool_template_module()
    runs, cache = tmp_path / "shared" / "runs", tmp_path / "shared" / "cache"
    template = pt.docker_template(
        image="eagle3-worker:cpu",
        networks=["eagle3-net"],
        volumes=[f"{runs}:/runs", f"{cache}:/mnt/assets"],
        env={
            "EAGLE3_CACHE": "/mnt/assets/eagle3-pipeline",
            "MLFLOW_TRACKING_URI": "http://mlflow:5000",
        },
        labels={"eagle3.dstack": str(tmp_path)},
    )
    _accepted_by_server(template, "docker")
    conf = _render(DockerConf, template, {})
    assert (
        conf.image == "eagle3-worker:cpu" and conf.networks == ["eagle3-net"] and conf.auto_remove
    )
    assert conf.volumes == [f"{runs}:/runs", f"{cache}:/mnt/assets"]
    assert (
        conf.env["EAGLE3_CACHE"] == "/mnt/assets/eagle3-pipeline"
        and "PREFECT__FLOW_RUN_ID" in conf.env
    )
    assert conf.labels["eagle3.dstack"] == str(tmp_path) and "io.prefect.flow-run-id" in conf.labels
    assert conf.get_network_mode() is None  # the network named, not inferred
    # a deployment's env adds to the pool's instead of replacing it
    conf = _render(DockerConf, template, {"env": {"EXTRA": "1"}})
    assert conf.env["EXTRA"] == "1" and conf.env["MLFLOW_TRACKING_URI"] == "http://mlflow:5000"

    gpu = pt.docker_template(
        image="eagle3-worker:gpu", networks=[], volumes=[], env={}, labels={}, gpus="all"
    )
    kwargs = _render(DockerConf, gpu, {}).container_create_kwargs
    host = docker.types.HostConfig(version="1.41", device_requests=kwargs["device_requests"])
    assert host["DeviceRequests"] == [
        {"Driver": "nvidia", "Count": -1, "DeviceIDs": [], "Capabilities": [["gpu"]], "Options": {}}
    ]
    with pytest.raises(pt.TemplateError, match="--gpus 'some'"):
        pt.docker_template(image="x", networks=[], volumes=[], env={}, labels={}, gpus="some")


def test_prefect_yaml_deployments_are_on_the_two_pools_and_load():
    import yaml
    from prefect.flows import load_flow_from_entrypoint

    spec = yaml.safe_load((REPO / "prefect.yaml").read_text())
    pools = {}
    for d in spec["deployments"]:
        flow = load_flow_from_entrypoint(str(REPO / d["entrypoint"]))
        flow.validate_parameters(
            d.get("parameters") or {}
        )  # raises for a parameter the flow does not take
        pools[(flow.name, d["name"])] = d["work_pool"]["name"]
        assert not (d["work_pool"].get("job_variables") or {}), (
            "infrastructure belongs to the pool's template"
        )
    assert set(pools.values()) == {"eagle3-gpu", "eagle3-cpu"}
    from flows.distributed import stage_deployment
    from flows.stages import STAGES

    for name in ("tiny-random", "smollm2-cpu"):  # each stage the orchestrator runs, on its pool
        placed = [pools[tuple(stage_deployment(s, name).split("/"))] for s in STAGES]
        assert [pools[("eagle3-distributed", name)], *placed] == [
            "eagle3-cpu",
            "eagle3-gpu",
            "eagle3-gpu",
            "eagle3-cpu",
            "eagle3-gpu",
        ]
    assert len(pools) == len(spec["deployments"]), "two deployments share a flow and a name"
    # one flow per stage: the local per-stage deployments and the work-pool stages are the same
    # flows
    assert {f for f, _ in pools} == {
        "eagle3-pipeline",
        "eagle3-sweep",
        "eagle3-distributed",
        *[f"eagle3-{s}" for s in STAGES],
    }
