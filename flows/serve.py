"""Serve every deployment of ``prefect.yaml`` from this one process (the local stack's runner).

``python -m flows.serve`` (what ``infra/stack.sh up`` starts) builds each deployment from its
entrypoint, name, parameters, description and tags in ``prefect.yaml`` and serves them all with
``prefect.serve``, so ``prefect deployment run 'eagle3-pipeline/smollm2-cpu'`` runs here. Work pools
are not used locally.
"""

from __future__ import annotations

import sys
from pathlib import Path

import yaml
from prefect import serve
from prefect.flows import load_flow_from_entrypoint

from eagle3.errors import ConfigError

REPO = Path(__file__).resolve().parents[1]


def load_deployments(path: Path = REPO / "prefect.yaml") -> list:
    """RunnerDeployments for every entry of ``path``'s ``deployments`` (ConfigError for a malformed
    entry)."""
    spec = yaml.safe_load(path.read_text())
    out = []
    for i, d in enumerate(spec.get("deployments") or []):
        missing = [k for k in ("name", "entrypoint") if not d.get(k)]
        if missing:
            raise ConfigError(f"{path}: deployments[{i}] lacks {missing}")
        flow = load_flow_from_entrypoint(str(REPO / d["entrypoint"]))
        out.append(flow.to_deployment(name=d["name"], parameters=d.get("parameters") or {},
                                      description=d.get("description"), tags=d.get("tags") or []))
    return out


def main() -> int:
    deployments = load_deployments()
    print(f"serving {len(deployments)} deployments: "
          + ", ".join(f"{d.flow_name}/{d.name}" for d in deployments), flush=True)
    serve(*deployments)
    return 0


if __name__ == "__main__":
    sys.exit(main())
