"""Base job templates of the two work pools (``eagle3-gpu``, ``eagle3-cpu``) that prefect.yaml's deployments use.

Infrastructure belongs to the pool, not to the deployment: the image, where the shared run directory and the asset
cache are mounted, the MLflow server's address and (for the GPU pool) the GPU request are defaults of the pool's
base job template, so the same ``prefect deploy --all`` runs on a Docker pool on one host or on a Kubernetes pool
of a cluster. Prints the template as JSON::

    python infra/pool_template.py docker --network eagle3-net --volume /srv/runs:/runs --volume /srv/cache:/cache \\
        --env MLFLOW_TRACKING_URI=http://mlflow:5000 --image eagle3-worker:cpu > pool.json
    prefect work-pool create eagle3-cpu --type docker --base-job-template pool.json --overwrite

    python infra/pool_template.py kubernetes --image registry.example.com/eagle3-worker:gpu --gpus 8 \\
        --env MLFLOW_TRACKING_URI=http://mlflow.eagle3:5000 > gpu.json
    prefect work-pool create eagle3-gpu --type kubernetes --base-job-template gpu.json --overwrite

``docker`` starts from the Docker worker's own default template (prefect-docker) and sets the defaults of its
variables; ``kubernetes`` starts from ``infra/k8s-work-pool-job-template.json`` (a Job per flow run with the two
PVCs mounted at /runs and /cache). Both are checked against their worker's job configuration by
``tests/unit/test_work_pools.py``.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any, Optional

import typer

K8S_TEMPLATE = Path(__file__).resolve().parent / "k8s-work-pool-job-template.json"
STACK_LABEL = "eagle3.dstack"  # containers of one distributed stack carry it (infra/dstack.sh removes them by it)

app = typer.Typer(add_completion=False, no_args_is_help=True, help=__doc__.split("\n\n")[0])


class TemplateError(ValueError):
    """A template or an option is unusable; the message names it, with the expected and the actual value."""


def _pairs(items: list[str], option: str) -> dict[str, str]:
    """``["K=V", ...]`` → ``{K: V}``; TemplateError naming the option for an item without ``=``."""
    out = {}
    for item in items:
        key, sep, value = item.partition("=")
        if not sep or not key:
            raise TemplateError(f"{option} {item!r}: expected KEY=VALUE")
        out[key] = value
    return out


def set_defaults(template: dict, values: dict[str, Any]) -> dict:
    """A copy of ``template`` whose variables ``values`` (name → default) have these defaults.

    Raises TemplateError for a name the template does not declare (a typo would otherwise be ignored)."""
    out = json.loads(json.dumps(template))
    props = out.get("variables", {}).get("properties", {})
    unknown = sorted(set(values) - set(props))
    if unknown:
        raise TemplateError(f"variables {unknown}: not declared by the template (it declares {sorted(props)})")
    for name, value in values.items():
        props[name]["default"] = value
    return out


def docker_template(*, image: str, networks: list[str], volumes: list[str], env: dict[str, str],
                    labels: dict[str, str], image_pull_policy: str = "Never", gpus: str | None = None) -> dict:
    """The Docker worker's default base job template with these defaults.

    ``volumes``: ``HOST_PATH:CONTAINER_PATH[:ro]`` bind mounts (the shared run directory, the asset cache).
    ``image_pull_policy``: ``Never`` for an image built on the host (``IfNotPresent`` / ``Always`` with a
    registry). ``gpus``: ``all`` or a count, requested as ``device_requests`` (needs the NVIDIA container
    toolkit on the host), or None for no GPU. Containers are removed when their flow run ends
    (``auto_remove``).
    """
    from prefect_docker.worker import DockerWorker

    if gpus is not None and gpus != "all" and not gpus.isdigit():
        raise TemplateError(f"--gpus {gpus!r}: expected 'all' or a number of GPUs")
    values: dict[str, Any] = {"image": image, "networks": networks, "volumes": volumes, "env": env,
                              "labels": labels, "image_pull_policy": image_pull_policy, "auto_remove": True,
                              "stream_output": True}
    if gpus is not None:
        count = -1 if gpus == "all" else int(gpus)
        values["container_create_kwargs"] = {
            "device_requests": [{"driver": "nvidia", "count": count, "capabilities": [["gpu"]]}]}
    return set_defaults(DockerWorker.get_default_base_job_template(), values)


def kubernetes_template(*, image: str | None, gpus: int | None, env: dict[str, str], namespace: str | None,
                        runs_pvc: str | None, cache_pvc: str | None, path: Path = K8S_TEMPLATE) -> dict:
    """``infra/k8s-work-pool-job-template.json`` with the given defaults (None: keep the file's).

    ``gpus``: ``nvidia.com/gpu`` requested per job (0 for the CPU pool)."""
    template = json.loads(Path(path).read_text())
    values: dict[str, Any] = {"image": image, "gpu_count": gpus, "env": env or None, "namespace": namespace,
                              "runs_pvc": runs_pvc, "cache_pvc": cache_pvc}
    return set_defaults(template, {k: v for k, v in values.items() if v is not None})


def _emit(template: dict) -> None:
    typer.echo(json.dumps(template, indent=2, sort_keys=True))


def _fail(e: TemplateError) -> None:
    typer.echo(f"error: {e}", err=True)
    raise typer.Exit(2)


@app.command()
def docker(image: str = typer.Option("eagle3-worker:cpu", help="worker image (infra/Dockerfile.worker)"),
           network: list[str] = typer.Option([], help="Docker network(s) the job containers join"),
           volume: list[str] = typer.Option([], help="HOST_PATH:CONTAINER_PATH bind mount (repeat)"),
           env: list[str] = typer.Option([], help="KEY=VALUE in the job environment (repeat)"),
           label: list[str] = typer.Option([], help="KEY=VALUE container label (repeat)"),
           pull: str = typer.Option("Never", help="image pull policy: Never, IfNotPresent, Always"),
           gpus: Optional[str] = typer.Option(None, help="'all' or a number: GPUs per job container")) -> None:
    """Base job template of a Docker work pool (prefect-docker's, with these defaults)."""
    try:
        _emit(docker_template(image=image, networks=network, volumes=volume, env=_pairs(env, "--env"),
                              labels=_pairs(label, "--label"), image_pull_policy=pull, gpus=gpus))
    except TemplateError as e:
        _fail(e)


@app.command()
def kubernetes(image: Optional[str] = typer.Option(None, help="worker image in the cluster's registry"),
               gpus: Optional[int] = typer.Option(None, min=0, help="nvidia.com/gpu per job (0: the CPU pool)"),
               env: list[str] = typer.Option([], help="KEY=VALUE in the job environment (repeat)"),
               namespace: Optional[str] = typer.Option(None), runs_pvc: Optional[str] = typer.Option(None),
               cache_pvc: Optional[str] = typer.Option(None)) -> None:
    """Base job template of a Kubernetes work pool (infra/k8s-work-pool-job-template.json, these defaults)."""
    try:
        _emit(kubernetes_template(image=image, gpus=gpus, env=_pairs(env, "--env"), namespace=namespace,
                                  runs_pvc=runs_pvc, cache_pvc=cache_pvc))
    except TemplateError as e:
        _fail(e)


if __name__ == "__main__":
    app()
