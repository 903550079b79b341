"""What the GPU benchmark scripts share: results kept per stage in ``results.json`` (so one
benchmark can be spread over several calls of limited length: ``--until STAGE`` stops after a stage,
``--resume`` skips the stages an earlier call on the same machine finished), a timestamped log line,
and the inputs every script prepares (the SmolLM2 target converted from its GGUF, a conversations
file that may be ``.gz``/``.xz``).
"""

from __future__ import annotations

import gzip
import json
import lzma
import os
import shutil
import time
import traceback
from pathlib import Path


OUTPUT_KEYS = ("dir", "path", "dev_prompts_file")  # a stage record's keys that name its outputs


class Results:
    """Figures by stage, rewritten to ``<work>/results.json`` (and ``<out>/results.json``) after
    every change.

    ``resume=True`` starts from the ``<work>/results.json`` of an earlier call on the same machine,
    so that one benchmark can be spread over several calls of limited length: stages recorded there
    are not run again."""

    def __init__(self, work: Path, out: Path, resume: bool = False, settings: dict | None = None):
        """Raises SystemExit (a message naming the file) when ``resume`` finds an unreadable
        results.json or one made with other ``settings`` (the arguments that change the figures)."""
        self.paths = list(dict.fromkeys([work / "results.json", out / "results.json"]))
        self.data: dict = {"stages": {}, "failures": [], "settings": settings or {}}
        if resume and self.paths[0].is_file():
            try:
                data = json.loads(self.paths[0].read_text())
                if not isinstance(data, dict) or not isinstance(data.get("stages"), dict):
                    got = (type(data.get("stages")).__name__ if isinstance(data, dict)
                           else type(data).__name__)
                    raise ValueError(f"expected an object with a 'stages' object, got {got}")
                if not isinstance(data.get("settings", {}), dict):
                    raise ValueError("'settings' is not an object")
                bad = [k for k, v in data["stages"].items() if not isinstance(v, dict)]
                if bad:
                    raise ValueError(f"stages {bad[:3]} are not objects")
                gone = [  # the files a finished stage made, which later stages read
                    f"{k}: {v[f]}"
                    for k, v in data["stages"].items()
                    for f in OUTPUT_KEYS
                    if isinstance(v.get(f), str) and not Path(v[f]).exists()
                ]
                if gone:
                    raise ValueError(
                        f"outputs of finished stages are missing here ({'; '.join(gone[:3])})"
                    )
            except ValueError as e:  # JSONDecodeError is a ValueError
                raise SystemExit(
                    f"--resume: {self.paths[0]} cannot be resumed ({e}); "
                    "delete it (or the whole --work folder) to start over"
                ) from e
            old = data.get("settings", {})
            diff = {
                k: (old.get(k), v) for k, v in (settings or {}).items() if k in old and old[k] != v
            }
            if diff:
                raise SystemExit(
                    f"--resume: {self.paths[0]} was made with other settings (name: "
                    f"earlier, now): {diff}; use the same arguments or another --work"
                )
            self.data = {**data, "failures": [], "settings": {**old, **(settings or {})}}
        elif resume:
            print(
                f"--resume: nothing to resume in {self.paths[0].parent} "
                f"(no results.json); starting fresh",
                flush=True,
            )
        for p in self.paths:
            p.parent.mkdir(parents=True, exist_ok=True)

    def _write(self) -> None:
        for p in self.paths:  # atomic: a kill mid-write leaves the previous complete file
            tmp = p.with_name(f".{p.name}.tmp")
            tmp.write_text(json.dumps(self.data, indent=1, default=str))
            os.replace(tmp, p)

    def put(self, key: str, value) -> None:
        self.data["stages"][key] = value
        self._write()

    def fail(self, what: str, err: BaseException) -> None:
        self.data["failures"].append(f"{what}: {type(err).__name__}: {str(err)[:400]}")
        self._write()


def log(msg: str, t0: float = [time.perf_counter()]) -> None:  # noqa: B006 - process start time
    print(f"[{time.perf_counter() - t0[0]:7.1f} s] {msg}", flush=True)


def prepare_target(a, work: Path) -> Path:
    """The HF folder of the target: ``--target``, else the GGUF converted by the project's own
    converter."""
    if a.target:
        return Path(a.target)
    import eagle3.assets as assets

    if a.gguf:
        gguf = Path(a.gguf).resolve()
        orig = assets.package_file
        assets.package_file = lambda pkg, rel: (
            gguf if pkg == assets.SMOLLM2_PACKAGE[0] else orig(pkg, rel)
        )
        return assets.prepare_smollm2(work / "cache")
    return assets.prepare_smollm2(
        Path(os.environ.get("EAGLE3_CACHE", "~/.cache/eagle3-pipeline")).expanduser()
    )


def data_file(a, work: Path) -> Path:
    """``--data`` as a plain JSONL file: a ``.gz`` or ``.xz`` file is decompressed into ``work``,
    again whenever the source differs (path, size or mtime, recorded in ``<copy>.source.json``) from
    the one the copy was made from. Raises RuntimeError naming ``--data`` when the compressed file
    is cut short or corrupt."""
    import lzma

    src = Path(a.data).expanduser()
    opener = {".gz": gzip.open, ".xz": lzma.open}.get(src.suffix)
    if opener is None:
        return src
    dst = work / src.name[: -len(src.suffix)]
    st = src.stat()
    made_from = {"path": str(src.resolve()), "size": st.st_size, "mtime_ns": st.st_mtime_ns}
    record = dst.with_name(dst.name + ".source.json")
    if dst.is_file() and record.is_file() and json.loads(record.read_text()) == made_from:
        return dst
    tmp = dst.with_name(f".{dst.name}.tmp")
    try:
        with opener(src, "rb") as f, open(tmp, "wb") as g:
            shutil.copyfileobj(f, g)
    except (EOFError, OSError, lzma.LZMAError) as e:
        tmp.unlink(missing_ok=True)
        raise RuntimeError(
            f"--data {src}: expected a complete {src.suffix} file, decompressing failed: {e}"
        ) from e
    os.replace(tmp, dst)
    record.write_text(json.dumps(made_from))
    return dst


def stage(res: Results, name: str, fn, *args):
    if name in res.data["stages"]:
        if not res.stop:  # a stage after --until's is neither run nor reported
            log(f"{name}: done in an earlier call")
        if name == res.until and not res.stop:
            log(f"stopping after {name} (--until)")
            res.stop = True
        return res.data["stages"][name]
    if res.stop:
        return None
    log(f"{name} ...")
    try:
        out = fn(*args)
    except Exception as e:  # noqa: BLE001 - later stages that do not need this one still run
        traceback.print_exc(limit=6)
        res.fail(name, e)
        if name == res.until:  # --until names the last stage to run, whether it ended well or not
            log(f"stopping after {name} (--until), which failed: {e}")
            res.stop = res.until_failed = True
        return None
    res.put(name, out)
    log(f"{name}: {json.dumps(out, default=str)[:400]}")
    if name == res.until:
        log(f"stopping after {name} (--until); run again with --resume for the rest")
        res.stop = True
    return out


def patch_assets(assets: Path | None) -> None:
    """Point the prompt sets at copies in ``--assets`` (the wheels that carry them are not installed
    on a GPU machine without a network): ``question.jsonl[.xz]`` (MT-Bench), ``test.jsonl[.xz]``
    (GSM8K)."""
    if assets is None:
        return
    import eagle3.assets as A

    files = {A.MTBENCH_PACKAGE[0]: "question.jsonl", A.GSM8K_PACKAGE[0]: "test.jsonl"}
    orig = A.package_file

    def local(pkg: str, rel: str) -> Path:
        name = files.get(pkg)
        if name is None:
            return orig(pkg, rel)
        plain = assets / name
        if not plain.is_file() and (assets / f"{name}.xz").is_file():
            plain.write_bytes(lzma.decompress((assets / f"{name}.xz").read_bytes()))
        return plain if plain.is_file() else orig(pkg, rel)

    A.package_file = local
