"""The MLflow store of ``lab/gpu_study.py`` across machines: ``--store-copy`` packs the store the
study wrote (database and small artifacts, without weights) with the sweep run's id, every 60 s
while the sweep runs and at the end; ``--store-from`` unpacks it on a fresh machine under the same
``--work`` and the sweep goes on from that run."""

from __future__ import annotations

import json
import lzma
import shutil
from pathlib import Path

from lab.harness import log

STORE_FILE = "mlflow_store.tar.xz"  # --store-copy writes it to --out, --store-from reads it
STORE_RECORD = "study.json"  # its member naming the sweep run and the --work it was made under
# lab/gpu_study.py's settings that a store copy's finished points were measured with: a later
# call going on from the copy must give the same (development curves and offline figures taken
# otherwise do not compare)
STORE_ARGS = ("dev_holdout", "dev_prompts", "eval_sets", "eval_tokens", "all_size")
WEIGHTS = (".safetensors", ".pt", ".bin")  # left out of the copy: it carries records, not drafts


def write_store_copy(work: Path, out: Path, sweep_run_id: str | None,
                     plan: dict | None = None) -> Path | None:
    """``out/mlflow_store.tar.xz``: the MLflow store the study wrote under ``work/runs``
    (``mlflow.db`` and ``mlartifacts`` without weights) and :data:`STORE_RECORD` (the sweep run
    id, ``work``, the plan's data variants and schedules, and ``args``, the settings of
    :data:`STORE_ARGS` its points were measured with), so that a later call on a fresh
    machine goes on with the same sweep run (``--store-from``). None, with a line saying why and
    whatever copy ``out`` already holds left as it is, when there is no store or no sweep run
    (a copy without one could not be continued)."""
    import io
    import tarfile

    store, dst = work / "runs", out / STORE_FILE
    if not (store / "mlflow.db").is_file() or not sweep_run_id:
        why = "no sweep run recorded" if sweep_run_id is None else "no store"
        older = f"; {dst} is an earlier call's" if dst.is_file() else ""
        log(f"store copy: not written ({why} in {work}){older}")
        return None
    record = json.dumps({"sweep_run_id": sweep_run_id, "work": str(work.resolve()),
                         "plan": {**{k: (plan or {}).get(k) for k in ("data", "schedules")},
                                  **({"args": plan["args"]} if (plan or {}).get("args") else {})}}
                        ).encode()
    tmp = dst.with_name(f".{dst.name}.tmp")
    db = dst.with_name(f".{dst.name}.db")
    _snapshot_sqlite(store / "mlflow.db", db)  # consistent while a sweep writes to it
    with tarfile.open(tmp, "w:xz") as tar:
        tar.add(db, "mlflow.db")
        if (store / "mlartifacts").is_dir():
            tar.add(store / "mlartifacts", "mlartifacts",
                    filter=lambda ti: None if ti.name.endswith(WEIGHTS) else ti)
        info = tarfile.TarInfo(STORE_RECORD)
        info.size = len(record)
        tar.addfile(info, io.BytesIO(record))
    tmp.replace(dst)
    db.unlink()
    return dst


def _snapshot_sqlite(src: Path, dst: Path) -> None:
    """``dst``: a consistent copy of the SQLite database ``src`` (SQLite's online backup), also
    while another process writes to it."""
    import sqlite3

    dst.unlink(missing_ok=True)
    a = sqlite3.connect(f"{src.resolve().as_uri()}?mode=ro", uri=True)
    b = sqlite3.connect(dst)
    try:
        a.backup(b)
    finally:
        a.close()
        b.close()


class StoreSnapshots:
    """While a sweep runs, :func:`write_store_copy` every ``every_s`` seconds from a daemon thread
    (``sweep_run_id()`` names the run, None until there is one), so that a call ended by its
    device time still leaves the points finished so far: ``lab/gpu/h200_sglang.sh wait SECONDS
    DIR`` copies the newest copy to the call's output at every poll. A copy taken mid-point holds
    that point's run unfinished; ``--store-from`` runs such a point again. A failed copy is
    logged and tried again at the next tick. Use as a context manager; leaving it stops the
    thread (the caller writes the last copy)."""

    def __init__(self, work: Path, out: Path, sweep_run_id, plan: dict | None,
                 every_s: float = 60.0):
        import threading

        self.args, self.every_s, self.sweep_run_id = (work, out, plan), every_s, sweep_run_id
        self.stopped = threading.Event()
        self.thread = threading.Thread(target=self._loop, name="store-snapshots", daemon=True)
        self.written = 0

    def _loop(self) -> None:
        work, out, plan = self.args
        while not self.stopped.wait(self.every_s):
            run_id = self.sweep_run_id()
            if not run_id or not (work / "runs" / "mlflow.db").is_file():
                continue
            try:
                write_store_copy(work, out, run_id, plan)
                self.written += 1
                log(f"store copy: snapshot {self.written} written to {out / STORE_FILE}")
            except Exception as e:  # noqa: BLE001 - a snapshot must never stop the sweep
                log(f"store copy: snapshot failed ({type(e).__name__}: {e}); next in "
                    f"{self.every_s:.0f} s")

    def __enter__(self) -> StoreSnapshots:
        self.thread.start()
        return self

    def __exit__(self, *exc) -> None:
        self.stopped.set()
        self.thread.join()


def read_store_record(src: Path) -> dict:
    """:data:`STORE_RECORD` of a store copy (:func:`write_store_copy`), read before any stage
    runs. Raises ValueError naming ``--store-from`` for a file that is not such a copy (not a
    readable tar.xz, no ``mlflow.db`` or record, no sweep run id in it)."""
    import tarfile

    try:
        with tarfile.open(src, "r:xz") as tar:
            names = set(tar.getnames())
            member = tar.extractfile(STORE_RECORD) if STORE_RECORD in names else None
            record = json.loads(member.read()) if member else None
            db = tar.extractfile("mlflow.db") if "mlflow.db" in names else None
            if db is not None and db.read(16) != b"SQLite format 3\x00":
                raise ValueError("its mlflow.db is not an SQLite database")
    except (OSError, tarfile.TarError, lzma.LZMAError, ValueError, EOFError) as e:
        raise ValueError(f"--store-from {src}: expected the {STORE_FILE} an earlier call wrote "
                         f"(--store-copy), could not read it: {type(e).__name__}: {e}") from e
    if "mlflow.db" not in names or not isinstance(record, dict) or not record.get("sweep_run_id"):
        raise ValueError(f"--store-from {src}: expected mlflow.db and {STORE_RECORD} with a "
                         f"sweep_run_id in it, got members {sorted(names)[:5]} and record "
                         f"{record!r}")
    return record


def store_problem(src: Path, work: Path, plan: dict | None) -> str | None:
    """What keeps the store copy ``src`` from going on under ``work`` with ``plan``, or None:
    another ``--work`` than the copy's (the store records absolute artifact paths), a store
    already in ``work``, a setting of :data:`STORE_ARGS` unlike the copy's (where the copy
    records them), or a data variant or schedule of the copy's plan that ``plan`` names with
    other overrides (its finished points, matched by name, would stand for points they are
    not). ValueError as :func:`read_store_record` for a file that is not a store copy."""
    record = read_store_record(src)
    if str(work.resolve()) != record.get("work"):
        return (f"--store-from {src}: made under --work {record.get('work')}, got --work "
                f"{work.resolve()}; use that --work (the store records absolute artifact paths)")
    if (work / "runs" / "mlflow.db").exists():
        return (f"--store-from {src}: {work / 'runs' / 'mlflow.db'} exists already; start from "
                "an empty --work, or leave out --store-from (and add --resume) to go on here")
    old = record.get("plan") or {}
    made, now = old.get("args") or {}, (plan or {}).get("args") or {}
    for key in sorted(set(made) & set(now)):
        if made[key] != now[key]:
            flag = "--" + key.replace("_", "-")
            return (f"--store-from {src}: its finished points were measured with {flag} "
                    f"{made[key]}, got {flag} {now[key]}; give {made[key]} (figures measured "
                    "otherwise would stand in one table with them)")
    for kind in ("data", "schedules"):
        for name, overrides in ((old.get(kind) or {}).items()):
            now = ((plan or {}).get(kind) or {}).get(name)
            if now is not None and now != overrides:
                return (f"--store-from {src}: {kind}.{name} was {overrides} in the copy's plan, "
                        f"got {now}; its finished points would stand for other ones (give the "
                        "changed one another name)")
    return None


def store_from_problem(src: Path, work: Path, plan: dict, resume: bool) -> str | None:
    """``--store-from src``'s check before any stage: :func:`store_problem`'s message (or
    :func:`read_store_record`'s for a file that is not a store copy), or None; None also when
    ``resume`` finds a store already restored in ``work``. A copy that records no settings
    (:data:`STORE_ARGS`) is taken with a warning naming the values ``plan['args']`` assumes."""
    try:
        record = read_store_record(src)
        if resume and (work / "runs" / "mlflow.db").exists():
            return None
        problem = store_problem(src, work, plan)
    except ValueError as e:
        return str(e)
    if not problem and not (record.get("plan") or {}).get("args"):
        args = (plan.get("args") or {}).items()
        given = ", ".join(f"--{k.replace('_', '-')} {v}" for k, v in args)
        log(f"warning: --store-from {src} records no settings to compare; its points are taken "
            f"as measured with this call's {given}")
    return problem


def restore_store(src: Path, work: Path, plan: dict | None = None) -> dict:
    """Unpack the store copy ``src`` into ``work/runs`` (a fresh machine's) and return the
    ``sweep_partial`` record the sweep stage continues from (``from``: ``src``). Raises ValueError
    with :func:`store_problem`'s message."""
    import tarfile

    record = read_store_record(src)
    problem = store_problem(src, work, plan)
    if problem:
        raise ValueError(problem)
    runs = work / "runs"
    runs.mkdir(parents=True, exist_ok=True)
    part = work / ".store-restoring"  # unpacked whole or not at all: a refused member leaves
    shutil.rmtree(part, ignore_errors=True)  # nothing behind in runs/
    try:
        with tarfile.open(src, "r:xz") as tar:
            tar.extractall(part, members=[m for m in tar.getmembers() if m.name != STORE_RECORD],
                           filter="data")
        for entry in part.iterdir():
            entry.replace(runs / entry.name)
    finally:
        shutil.rmtree(part, ignore_errors=True)
    log(f"store: sweep run {record['sweep_run_id']} restored from {src} into {runs}")
    return {"parent_run_id": record["sweep_run_id"],
            "mlflow_uri": f"sqlite:///{runs / 'mlflow.db'}", "run_dir": None, "from": str(src)}
