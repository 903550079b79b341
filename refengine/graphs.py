"""Fixed-shape steps that run eagerly or as captured CUDA graphs, the same Python function both
ways.

A :class:`Step` wraps a function of no arguments that reads and writes only preallocated tensors.
Eagerly (CPU, graphs off) calling the step calls the function; after :func:`capture_steps` it
replays the graph recorded from that very function, so the eager call is the CPU-testable twin of
the graph. Capture follows ``torch.cuda.graphs``: warm-up calls on a side stream (workspaces,
autotuning), then one recorded call; all graphs share one memory pool, safe because no step leaves a
live tensor behind and steps run one after another on one stream. A failed capture drops every graph
and says why; the steps keep running eagerly."""

from __future__ import annotations

import logging
from typing import Callable

import torch

log = logging.getLogger(__name__)


class Step:
    """A named fixed-shape step; ``step()`` replays its CUDA graph when captured, else runs ``fn``
    eagerly."""

    def __init__(self, name: str, fn: Callable[[], None]):
        self.name, self.fn = name, fn
        self.graph: "torch.cuda.CUDAGraph | None" = None

    def __call__(self) -> None:
        if self.graph is not None:
            self.graph.replay()
        else:
            self.fn()

    def __repr__(self) -> str:
        return f"Step({self.name}, {'graph' if self.graph is not None else 'eager'})"


def capture_steps(steps: list[Step], device: torch.device, reset: Callable[[], None],
                  warmup: int = 2) -> str:
    """Capture a CUDA graph for every step (``reset()`` restores safe state before each warm-up and
    capture). Returns ``"on (N graphs)"`` or ``"off (capture of <step> failed: <error>)"`` (then no
    step has a graph); ValueError when ``device`` is not CUDA."""
    if device.type != "cuda":
        raise ValueError(f"capture_steps: CUDA graphs need a CUDA device, got {device}")
    current = None
    try:
        pool = torch.cuda.graph_pool_handle()
        side = torch.cuda.Stream(device=device)
        side.wait_stream(torch.cuda.current_stream(device))
        with torch.cuda.stream(side):
            for current in steps:
                for _ in range(warmup):
                    reset()
                    current.fn()
        torch.cuda.current_stream(device).wait_stream(side)
        torch.cuda.synchronize(device)
        for current in steps:
            reset()
            graph = torch.cuda.CUDAGraph()
            with torch.cuda.graph(graph, pool=pool):
                current.fn()
            current.graph = graph
        torch.cuda.synchronize(device)
        reset()
    except Exception as e:  # noqa: BLE001 - any capture failure falls back to eager steps, reported
        for s in steps:
            s.graph = None
        try:
            torch.cuda.synchronize(device)
        except Exception:  # noqa: BLE001 - a broken context shows up again at the next real step
            pass
        name = current.name if current is not None else "?"
        first = str(e).splitlines()[0][:300] if str(e) else ""
        msg = f"off (capture of {name} failed: {type(e).__name__}: {first})"
        log.warning("CUDA graphs %s; running eagerly", msg)
        return msg
    return f"on ({len(steps)} graphs)"
