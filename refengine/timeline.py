"""Where the time of a decoding loop goes: ``mark(name)`` starts interval ``name`` until the next
mark. On CUDA a mark records an event on the current stream, so an interval is device time (a
piece's GPU time, or for a host-side interval the time the GPU waited); on the CPU
``time.perf_counter()``. Used only when asked (``lab/gpu_speedup.py``'s profiling rounds): an event
per piece."""

from __future__ import annotations

import time

import torch


class Timeline:
    """Marks of one generation; :meth:`durations_ms` gives ``{interval name: [ms, ...]}`` after it
    ended."""

    def __init__(self, device: torch.device):
        self.cuda = device.type == "cuda"
        self.marks: list[tuple[str, object]] = []
        self.host_marks: list[tuple[str, float]] = []

    def mark(self, name: str) -> None:
        """Start interval ``name`` (ends the previous one)."""
        now = time.perf_counter()
        if self.cuda:
            ev = torch.cuda.Event(enable_timing=True)
            ev.record()
            self.marks.append((name, ev))
        else:
            self.marks.append((name, now))
        self.host_marks.append((name, now))

    def durations_ms(self) -> dict[str, list[float]]:
        """Device-side (CUDA) or wall (CPU) milliseconds of every interval, by name, in order."""
        if self.cuda and self.marks:
            self.marks[-1][1].synchronize()
        out: dict[str, list[float]] = {}
        for (name, a), (_, b) in zip(self.marks, self.marks[1:]):
            ms = a.elapsed_time(b) if self.cuda else (b - a) * 1e3
            out.setdefault(name, []).append(float(ms))
        return out

    def host_intervals_ms(self, name: str) -> list[float]:
        """Host wall milliseconds between consecutive marks called ``name`` (one loop iteration
        each)."""
        times = [t for n, t in self.host_marks if n == name]
        return [(b - a) * 1e3 for a, b in zip(times, times[1:])]
