"""Extraction + training, offline (hidden states stored, then read) vs online (the target inside
the training job, states recomputed every epoch), for 1 and N epochs of one config.

Each (mode, epochs) case runs in a fresh process (``--case``) into its own work folder: the extract
stage then the train stage of the product (eagle3.extract.stage.extract, eagle3.train.stage.train),
so the timings include the target's load and everything a pipeline run does. Per case the JSON
holds: seconds of each stage and in all, tokens (samples' tokens, training positions seen, target
tokens computed), bytes on disk (the extract folder's hidden states, the whole extract folder, the
train folder), peak GPU memory (bytes, ``torch.cuda.max_memory_allocated`` over both stages: on a
CUDA training device), the online figures of the train manifest (``cached``: the window's bytes
at the end, ``peak_window_bytes``; the window is removed when training ends), and the final
losses. ``--modes offline online cached -o extract.cache_max_gb=G`` adds the bounded window.

    python lab/online_vs_offline.py configs/tiny-random.yaml --epochs 1 2 --device cpu \
        -o data.num_conversations=12            # CPU smoke (a minute)
    python lab/online_vs_offline.py configs/llama3.1-8b.yaml --epochs 1 3 --device cuda \
        --out lab/results/<date>_online_vs_offline.json                   # an H200

``--device`` sets ``extract.device`` and ``train.device`` (online: the target runs on the
training device); ``-o extract.cache_max_gb=G`` is given to the cached cases only. Results
default to ``lab/results/<UTC date and time>_online_vs_offline.json``, a new file per run.

The arguments are checked before any case starts (:func:`check_arguments`): every ``--epochs``
value positive and finite, no mode or epochs value given twice, the config of every (mode,
epochs) case loading with its overrides (``eagle3.config.load_config``: the file, ``-o``,
``--device``, ``cached`` without ``extract.cache_max_gb``), ``--work`` creatable, ``--out`` a
file that can be written; a bad one is an argparse error (exit 2) naming it. A case that fails
on a project error prints that error's line (exit 1), not a traceback.
"""

from __future__ import annotations

import argparse
import datetime as dt
import json
import math
import os
import subprocess
import sys
import time
from pathlib import Path

os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TRANSFORMERS_OFFLINE", "1")
ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

MODES = ("offline", "online", "cached")  # cached: pass -o extract.cache_max_gb=G
WINDOW_KEY = "extract.cache_max_gb="


CASE_KEYS = ("extract.mode", "train.epochs")  # set by each case: --modes, --epochs


def case_overrides(overrides: list[str], mode: str, epochs: float,
                   device: str | None = None) -> list[str]:
    """The ``-o`` overrides of one case: ``overrides`` (the window's size only for ``cached``: the
    other modes would warn that it is unused), ``--device`` as ``train.device`` (and
    ``extract.device`` for ``offline``: online and cached run the target on the training device),
    then the case's mode and epochs."""
    keep = [o for o in overrides if mode == "cached" or not o.startswith(WINDOW_KEY)]
    if device:
        keep += [f"train.device={device}"] + ([f"extract.device={device}"]
                                              if mode == "offline" else [])
    return [*keep, f"extract.mode={mode}", f"train.epochs={epochs}"]


def label(epochs: float) -> str:
    """``epochs`` as a case's name and folder show it (``1``, ``2.5``, ``1.0000001``)."""
    return f"{epochs:.12g}"


def folder_bytes(path: Path, pattern: str = "*") -> int:
    """Bytes of the files under ``path`` matching ``pattern`` (0 when it does not exist)."""
    if not path.exists():
        return 0
    return sum(p.stat().st_size for p in path.rglob(pattern) if p.is_file())


def run_case(config: str, overrides: list[str], mode: str, epochs: float, work: Path,
             device: str | None = None) -> dict:
    """One case in this process: extract then train into ``work``; returns its result record."""
    import torch

    from eagle3.config import load_config
    from eagle3.extract.stage import extract
    from eagle3.train.stage import train

    cfg = load_config(config, [*case_overrides(overrides, mode, epochs, device),
                               f"paths.runs_dir={work / 'runs'}"])
    cuda = torch.cuda.is_available() and cfg.train.device != "cpu"
    if cuda:
        torch.cuda.reset_peak_memory_stats()
    ex_dir, tr_dir = work / "extract", work / "train"
    load_before = os.getloadavg()  # other work on the machine skews the seconds: recorded
    t0 = time.perf_counter()
    ex = extract(cfg, ex_dir, progress=False)
    if cuda:
        torch.cuda.synchronize()
        peak_extract = torch.cuda.max_memory_allocated()
        torch.cuda.empty_cache()
        torch.cuda.reset_peak_memory_stats()
    t1 = time.perf_counter()
    tr = train(cfg, ex_dir, tr_dir, progress=False)
    if cuda:
        torch.cuda.synchronize()
    t2 = time.perf_counter()
    final = (tr.get("metrics") or {})
    return {
        "mode": mode, "epochs": epochs, "cache_max_gb": cfg.extract.cache_max_gb,
        "device": str(tr.get("device")),
        "gpu": torch.cuda.get_device_name() if cuda else None,
        "seconds": {"extract": t1 - t0, "train": t2 - t1, "total": t2 - t0},
        "load_average_1_5_15min": {"before": load_before, "after": os.getloadavg()},
        "cpu_count": os.cpu_count(),
        "tokens": {"samples": ex["counts"]["tokens"], "train_positions_seen": tr["counts"]
                   ["tokens_seen"], "target_tokens_computed": (
                       (tr.get("online") or {}).get("tokens_recomputed")
                       if mode != "offline" else ex["counts"]["tokens"])},
        "disk_bytes": {"hidden_states": folder_bytes(ex_dir / "hidden_states"),
                       "extract_folder": folder_bytes(ex_dir),
                       "train_folder": folder_bytes(tr_dir)},
        "peak_gpu_bytes": ({"extract": peak_extract, "train": torch.cuda.max_memory_allocated()}
                           if cuda else None),
        "offline_bytes_estimate": ex.get("offline_bytes_estimate"),
        "extract_tokens_per_s": (ex.get("tokens_per_s") if mode == "offline"
                                 else (tr.get("online") or {}).get("extract_tokens_per_s")),
        "peak_window_bytes": (tr.get("online") or {}).get("cache_bytes"),
        "online": tr.get("online"), "optimizer_steps": tr["optimizer_steps"],
        "final_train_loss": (final.get("final_train") or {}).get("train/loss"),
        "final_val_loss": (final.get("final_eval") or {}).get("val/loss"),
        "simulated_acceptance_length": (final.get("final_eval") or {}).get(
            "val/simulated_acceptance_length"),
        "dev_acceptance_length": (final.get("final_eval") or {}).get("dev/acceptance_length"),
    }


def comparisons(rows: list[dict]) -> list[dict]:
    """Each non-offline case against the offline case of the same epochs: total seconds as a
    ratio (``time_vs_offline``: < 1 is faster), hidden-state bytes on disk
    (``hidden_state_bytes``: the extract folder's, 0 for online and cached;
    ``peak_window_bytes``: the cached window's peak, removed when training ends, None for
    online; ``offline_hidden_state_bytes``), and the relative
    acceptance difference (``acceptance_rel_diff``: simulated acceptance length on the validation
    split, and the development prompts' measured one when the config has them; None when either
    side lacks it)."""
    base = {r["epochs"]: r for r in rows if r["mode"] == "offline"}

    def rel(a, b):
        return None if a is None or b in (None, 0) else a / b - 1.0

    out = []
    for r in rows:
        b = base.get(r["epochs"])
        if r["mode"] == "offline" or b is None:
            continue
        out.append({"mode": r["mode"], "epochs": r["epochs"],
                    "time_vs_offline": r["seconds"]["total"] / b["seconds"]["total"],
                    "hidden_state_bytes": r["disk_bytes"]["hidden_states"],
                    "peak_window_bytes": r.get("peak_window_bytes"),
                    "offline_hidden_state_bytes": b["disk_bytes"]["hidden_states"],
                    "acceptance_rel_diff": {
                        "simulated": rel(r.get("simulated_acceptance_length"),
                                         b.get("simulated_acceptance_length")),
                        "dev": rel(r.get("dev_acceptance_length"),
                                   b.get("dev_acceptance_length"))}})
    return out


def write_results(out: Path, a: argparse.Namespace, rows: list[dict]) -> None:
    """The results JSON: arguments, the cases so far and :func:`comparisons` (rewritten after
    every case, so a run cut short keeps what it measured)."""
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps({"config": str(Path(a.config).absolute()), "overrides": a.override,
                               "device": a.device, "written_at": dt.datetime.now(
                                   dt.timezone.utc).isoformat(timespec="seconds"),
                               "cases": rows, "comparisons": comparisons(rows)},
                              indent=1, default=str) + "\n")


EXAMPLES = """examples:
  python lab/online_vs_offline.py configs/tiny-random.yaml --epochs 1 2 --device cpu \\
      -o data.num_conversations=12                    # CPU smoke (a minute)
  python lab/online_vs_offline.py configs/tiny-random.yaml --modes offline cached \\
      -o extract.cache_max_gb=0.5 --epochs 2 --device cpu   # the bounded window
"""


def check_arguments(ap: argparse.ArgumentParser, a: argparse.Namespace,
                    overrides: list[str]) -> None:
    """Refuse, before any case runs, what would fail inside a case's process: an ``--epochs``
    value that is not a positive finite number, a config that does not load with its overrides
    (ConfigError: the file, a key, a value), or not for some (mode, epochs) case, devices this
    machine lacks (``eagle3.device_checks.check_devices``), a ``--work`` that cannot be created.
    ``ap.error`` (exit 2) names the argument and both values."""
    from eagle3.config import load_config
    from eagle3.device_checks import check_devices
    from eagle3.errors import ConfigError

    bad = [e for e in a.epochs if not (math.isfinite(e) and e > 0)]
    if bad:
        ap.error(f"--epochs: expected positive, finite numbers of epochs, got {a.epochs} "
                 f"({bad[0]:g} is not)")
    for o in overrides:
        if o.split("=", 1)[0].strip() in CASE_KEYS:
            ap.error(f"-o {o}: expected no {' or '.join(CASE_KEYS)} override (each case sets "
                     "them: give --modes and --epochs), got one")
    for name, values in (("--modes", a.modes), ("--epochs", [label(e) for e in a.epochs])):
        twice = sorted({str(v) for v in values if values.count(v) > 1})
        if twice:
            ap.error(f"{name}: expected each value once (a case runs once), got {values} "
                     f"({', '.join(twice)} more than once)")
    device = ([f"extract.device={a.device}", f"train.device={a.device}"] if a.device else [])
    try:
        check_devices(load_config(a.config, [*overrides, *device]))
    except ConfigError as e:
        ap.error(str(e))
    for mode in a.modes:
        for epochs in a.epochs:
            try:
                load_config(a.config, case_overrides(overrides, mode, epochs, a.device))
            except ConfigError as e:
                ap.error(f"case {mode} x {label(epochs)} epochs: {e}")
    check_out(ap, a.out)
    try:
        a.work.mkdir(parents=True, exist_ok=True)
    except OSError as e:
        ap.error(f"--work {a.work}: expected a folder that can be created, got "
                 f"{type(e).__name__}: {e.strerror or e}")


def check_out(ap: argparse.ArgumentParser, out: Path) -> None:
    """``--out`` must name a file that can be written: not a folder, its folder creatable and
    writable (checked by creating and removing a probe file beside it), so that a run does not
    end, after all its cases, without its results. ``ap.error`` (exit 2) otherwise."""
    if out.is_dir():
        ap.error(f"--out {out}: expected a results file (JSON), got a folder")
    above = next((p for p in out.parents if p.exists()), None)
    if above is not None and not above.is_dir():
        ap.error(f"--out {out}: expected a file in a folder, got {above}, a file, above it")
    probe = out.parent / f".{out.name}.probe-{os.getpid()}"
    try:
        out.parent.mkdir(parents=True, exist_ok=True)
        probe.write_text("")
        probe.unlink()
    except OSError as e:
        ap.error(f"--out {out}: expected a file that can be written, got "
                 f"{type(e).__name__}: {e.strerror or e}")


class _Stopped(Exception):
    """A signal to the driver while a case runs (:func:`run_child`)."""

    def __init__(self, signum: int):
        super().__init__(signum)
        self.signum = signum


def run_child(cmd: list[str]) -> int:
    """Run one case's process in its own process group and return its exit status. SIGTERM or
    SIGINT to this driver ends that group (SIGTERM, then SIGKILL after 10 s) before the driver
    exits with 128 + the signal: a case does not go on alone, holding the GPU, after its driver
    has gone. The handlers are in place before the case starts, and a second signal is ignored
    while the case ends."""
    import signal

    procs: list[subprocess.Popen] = []

    def stop(signum, _frame):  # no waiting here: the interrupted wait holds the Popen's lock
        for proc in procs:
            try:
                os.killpg(proc.pid, signal.SIGTERM)
            except ProcessLookupError:
                pass
        raise _Stopped(signum)

    old = {s: signal.signal(s, stop) for s in (signal.SIGTERM, signal.SIGINT)}
    try:
        procs.append(subprocess.Popen(cmd, start_new_session=True))
        return procs[0].wait()
    except _Stopped as e:
        for sig in old:  # until this process exits: the escalation is not cut short
            signal.signal(sig, signal.SIG_IGN)
        for proc in procs:
            try:
                proc.wait(timeout=10)
            except subprocess.TimeoutExpired:
                os.killpg(proc.pid, signal.SIGKILL)
                proc.wait()
        raise SystemExit(128 + e.signum) from None
    finally:
        if signal.getsignal(signal.SIGTERM) is stop:
            for sig, handler in old.items():
                signal.signal(sig, handler)


def percent(x: float | None) -> str:
    """A relative difference as a signed percentage (``+0.27 %``), ``n/a`` for None."""
    return "n/a" if x is None else f"{100 * x:+.2f} %"


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0], epilog=EXAMPLES,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("config")
    ap.add_argument("--epochs", type=float, nargs="+", default=[1.0, 3.0])
    ap.add_argument("--modes", nargs="+", choices=MODES, default=["offline", "online"],
                    help="cached needs -o extract.cache_max_gb=G")
    ap.add_argument("--device", default=None, help="extract.device and train.device")
    ap.add_argument("-o", "--override", action="append", default=[], help="section.key=value")
    ap.add_argument("--work", type=Path, default=ROOT / ".lab-work" / "online_vs_offline")
    ap.add_argument("--out", type=Path, default=None)
    ap.add_argument("--case", nargs=3, metavar=("MODE", "EPOCHS", "JSON"),
                    help=argparse.SUPPRESS)  # one case in this process (the driver's child)
    a = ap.parse_args(argv)
    a.out = (a.out or ROOT / "lab" / "results" / (
        f"{dt.datetime.now(dt.timezone.utc):%Y-%m-%dT%H%M%SZ}_online_vs_offline.json")).absolute()
    a.work = a.work.absolute()  # the case processes see the same files whatever their folder
    overrides = list(a.override)
    if a.case:
        from eagle3.errors import Eagle3Error

        mode, epochs, out = a.case
        try:
            rec = run_case(a.config, overrides, mode, float(epochs), a.work, a.device)
        except Eagle3Error as e:  # a fact about the inputs: its message says what to change
            print(f"error: case {mode} x {label(float(epochs))} epochs: {e}", file=sys.stderr)
            return 1
        Path(out).write_text(json.dumps(rec, indent=1, default=str))
        return 0
    check_arguments(ap, a, overrides)
    from eagle3.assets import resolve_target
    from eagle3.config import load_config

    # the target folder is written (tiny-random, a GGUF conversion) before any case's clock starts
    print("target:", resolve_target(load_config(a.config, case_overrides(
        overrides, a.modes[0], a.epochs[0], a.device))), flush=True)
    out = a.out
    rows = []
    for epochs in a.epochs:
        for mode in a.modes:
            work = a.work / f"{mode}-{label(epochs)}ep"
            if work.exists():
                import shutil

                shutil.rmtree(work)  # every case starts without stored states or checkpoints
            work.mkdir(parents=True)
            rec_file = work / "case.json"
            cmd = [sys.executable, str(Path(__file__).resolve()), a.config, "--work", str(work),
                   "--case", mode, str(epochs), str(rec_file)]
            cmd += [x for o in a.override for x in ("-o", o)]
            cmd += ["--device", a.device] if a.device else []
            rc = run_child(cmd)
            if rc != 0:
                print(f"case {mode} x {label(epochs)} epochs failed (exit {rc})", file=sys.stderr)
                return rc
            rows.append(json.loads(rec_file.read_text()))
            s = rows[-1]
            window = ("" if s["peak_window_bytes"] is None
                      else f" + a window of {s['peak_window_bytes']:,} B while training")
            print(f"{mode:8s} {label(epochs)} ep: {s['seconds']['total']:.1f} s, hidden states on "
                  f"disk {s['disk_bytes']['hidden_states']:,} B{window}, target tokens "
                  f"{s['tokens']['target_tokens_computed']}, simulated acceptance "
                  f"{s['simulated_acceptance_length']}", flush=True)
            write_results(out, a, rows)
    for c in comparisons(rows):
        acc = c["acceptance_rel_diff"]
        window = ("" if c["peak_window_bytes"] is None
                  else f" (a window of at most {c['peak_window_bytes']:,} B while training)")
        print(f"{c['mode']} / offline, {label(c['epochs'])} ep: time {c['time_vs_offline']:.3f}x, "
              f"acceptance vs offline: simulated {percent(acc['simulated'])}, dev "
              f"{percent(acc['dev'])}; hidden states on disk {c['hidden_state_bytes']:,} B"
              f"{window} vs offline's {c['offline_hidden_state_bytes']:,} B")
    print(f"results: {out}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
