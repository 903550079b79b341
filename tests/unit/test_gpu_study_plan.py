"""lab/gpu_study.py's plan: a failed regen stage stops the sweep with its own message, not a config
error."""

import argparse
import hashlib
import json
from pathlib import Path

import pytest

from lab.study_inputs import resolve_plan as _plan


def _args(tmp_path, plan):
    f = tmp_path / "plan.json"
    f.write_text(json.dumps(plan))
    return argparse.Namespace(plan=str(f), tiny=False, all_size=100)


PLAN = {
    "data": {"as-is": [], "regenerated": ["data.source=file", "data.path={regen}"]},
    "schedules": {"c": ["train.epochs=1"]},
    "points": [["regenerated", 0, "c"], ["as-is", 10, "c"]],
}


def test_plan_without_a_regenerated_file_names_the_variants_that_need_it(tmp_path):
    with pytest.raises(
        RuntimeError, match=r"data variant\(s\) regenerated read the regenerated file"
    ):
        _plan(_args(tmp_path, PLAN), "")


def test_plan_fills_in_the_regenerated_file_and_the_all_size(tmp_path):
    out = _plan(_args(tmp_path, PLAN), "/x/regen.jsonl")
    assert out["data"]["regenerated"] == ["data.source=file", "data.path=/x/regen.jsonl"]
    assert out["points"] == [["regenerated", 100, "c"], ["as-is", 10, "c"]]


def test_plan_without_regenerated_variants_needs_no_regen_file(tmp_path):
    plan = {"data": {"as-is": []}, "schedules": PLAN["schedules"], "points": [["as-is", 10, "c"]]}
    assert _plan(_args(tmp_path, plan), "")["points"] == [["as-is", 10, "c"]]


def _regen(tmp_path, n_lines=3, made_for=3, conversations=3):
    from lab.gpu_study import _manifest_of

    src = tmp_path / "carried" / "regenerated.jsonl"
    src.parent.mkdir()
    rows = [
        json.dumps(
            {
                "id": str(i),
                "messages": [
                    {"role": "user", "content": f"q{i}"},
                    {"role": "assistant", "content": f"a{i}"},
                ],
            }
        )
        for i in range(n_lines)
    ]
    src.write_text("\n".join(rows) + "\n")
    _manifest_of(src).write_text(
        json.dumps(
            {
                "kind": "regenerated_conversations",
                "seconds": 12.5,
                "sha256": hashlib.sha256(src.read_bytes()).hexdigest(),
                "settings": {"num_conversations": made_for},
                "counts": {"conversations": conversations, "answers": conversations},
            }
        )
    )
    return src


def test_carried_back_regen_file_is_reused_byte_for_byte_from_its_xz_copy(tmp_path):
    from lab.gpu_study import _manifest_of, carry_back_regen, reuse_regen

    src = _regen(tmp_path)
    out = tmp_path / "out"
    out.mkdir()
    carry_back_regen(src, out)
    xz = out / "regenerated.jsonl.xz"
    assert xz.stat().st_size > 0 and _manifest_of(xz).name == "regenerated.jsonl.manifest.json"
    got = reuse_regen(xz, 3, tmp_path / "work" / "regenerated.jsonl")
    assert (tmp_path / "work" / "regenerated.jsonl").read_bytes() == src.read_bytes()
    assert (
        got["counts"]["conversations"] == 3
        and got["seconds"] == 0.0
        and got["reused_from"] == str(xz)
    )
    assert json.loads(_manifest_of(tmp_path / "work" / "regenerated.jsonl").read_text())[
        "reused_from"
    ] == str(xz)


def test_regen_file_made_for_another_count_or_truncated_or_without_manifest_is_refused(tmp_path):
    from lab.gpu_study import _manifest_of, reuse_regen

    src = _regen(tmp_path, n_lines=2, made_for=3, conversations=3)
    with pytest.raises(RuntimeError, match=r"num_conversations is 3, expected --regen 5"):
        reuse_regen(src, 5, tmp_path / "w.jsonl")
    with pytest.raises(RuntimeError, match=r"settings.max_new_tokens is None, expected "
                                           r"--regen-max-new-tokens 256"):
        reuse_regen(src, 3, tmp_path / "w.jsonl", 256)
    with pytest.raises(
        RuntimeError,
        match=r"2 conversations in the file, its manifest's counts.conversations says 3",
    ):
        reuse_regen(src, 3, tmp_path / "w.jsonl")
    _manifest_of(src).unlink()
    with pytest.raises(
        RuntimeError, match=r"expected its manifest .*regenerated.jsonl.manifest.json"
    ):
        reuse_regen(src, 3, tmp_path / "w.jsonl")


def test_reused_regen_file_is_not_written_back_to_out(tmp_path, monkeypatch):
    """The device returns at most 8 files from --out: a run given --regen-file spends none on a copy
    of it."""
    import lab.gpu_study as G
    from lab import study_inputs

    src = _regen(tmp_path)
    first = tmp_path / "out1"
    first.mkdir()
    G.carry_back_regen(src, first)
    out = tmp_path / "out2"
    argv = [
        "--device",
        "cpu",
        "--work",
        str(tmp_path / "w2"),
        "--out",
        str(out),
        "--quiet",
        "--regen-file",
        str(first / "regenerated.jsonl.xz"),
        "--until",
        "regen",
        "--regen",
        "3",
        "--plan",
        str(_args(tmp_path, {**PLAN, "points": [["regenerated", 3, "c"]]}).plan),
    ]
    monkeypatch.setattr(G, "prepare_target", lambda a, work: tmp_path)
    monkeypatch.setattr(study_inputs, "_cached_sharegpt", lambda work: str(src))
    monkeypatch.setattr(
        G, "base_overrides", lambda a, work, target, data, dev=None: ["data.source=file"]
    )
    assert G.main(argv) == 0
    assert (tmp_path / "w2" / "regenerated.jsonl").read_bytes() == src.read_bytes()
    assert not (out / "regenerated.jsonl.xz").exists()


def test_regen_file_with_changed_content_or_a_cut_xz_is_refused(tmp_path):
    """Same line count, other content: the manifest's sha256 catches it; a byte-truncated .xz names
    the file."""
    import lzma

    from lab.gpu_study import _manifest_of, reuse_regen

    src = _regen(tmp_path)
    src.write_text(src.read_text().replace("a1", "b1"))
    with pytest.raises(
        RuntimeError, match=r"sha256 is [0-9a-f]{64}, .*manifest.json records '[0-9a-f]{64}'"
    ):
        reuse_regen(src, 3, tmp_path / "w" / "regenerated.jsonl")
    cut = tmp_path / "cut" / "regenerated.jsonl.xz"
    cut.parent.mkdir()
    cut.write_bytes(lzma.compress(src.read_bytes())[:40])
    _manifest_of(cut).write_bytes(_manifest_of(src).read_bytes())
    with pytest.raises(
        RuntimeError, match=r"--regen-file .*cut/regenerated.jsonl.xz: expected a complete .xz"
    ):
        reuse_regen(cut, 3, tmp_path / "w" / "regenerated.jsonl")


@pytest.mark.parametrize(
    "text,match",
    [
        ('{"data": {"as-is": []},\n', r"expected JSON, got Expecting property name"),
        ('{"data": {"as-is": []}, "data": {}}', r"expected each key once, got key 'data' given "
         "twice in one object"),
        (
            '{"data": {"as-is": []}, "schedules": {"c": []}}',
            r"'points' expected a non-empty list .* got None",
        ),
        (
            '{"data": {"as-is": []}, "schedules": {"c": []}, "points": []}',
            r"'points' expected a non-empty list",
        ),
        (
            '{"data": {"as-is": []}, "schedules": {"c": []}, "points": [["as-is", 8, "nosuch"]]}',
            r"points\[0\] = \['as-is', 8, 'nosuch'\]: expected \[data in "
            r"\['as-is'\], size >= 0 \(0 = all\), schedule in \['c'\]\]",
        ),
        ("[1, 2]", r"expected a JSON object, got list"),
    ],
)
def test_bad_plan_is_refused_when_the_arguments_are_parsed(tmp_path, capsys, text, match):
    """A bad --plan stops the study before its first stage (on a GPU, before the GGUF conversion and
    the regeneration), naming --plan and the key."""
    import re

    from lab.gpu_study import parse_args

    plan = tmp_path / "plan.json"
    plan.write_text(text)
    with pytest.raises(SystemExit) as e:
        parse_args(["--device", "cpu", "--plan", str(plan)])
    err = capsys.readouterr().err
    assert e.value.code == 2 and f"--plan {plan}" in err and re.search(match, err), err


def test_tiny_says_which_given_values_it_replaces(capsys):
    from lab.gpu_study import parse_args

    a = parse_args(["--device", "cpu", "--tiny", "--regen", "5", "--eval-tokens", "8"])
    err = capsys.readouterr().err
    assert a.regen == 12 and "--tiny sets --regen 12 (given: 5)" in err and "eval-tokens" not in err


def test_data_copy_follows_a_new_data_file_and_a_cut_xz_names_it(tmp_path):
    """lab.harness.data_file: a second --data with the same name on the same --work is decompressed
    again (not the first file's copy reused); a cut .xz is refused naming --data."""
    import lzma
    from types import SimpleNamespace

    from lab.harness import data_file

    work = tmp_path / "work"
    work.mkdir()
    for name, n in (("A", 3), ("B", 11)):
        (tmp_path / name).mkdir()
        (tmp_path / name / "sg.jsonl.xz").write_bytes(lzma.compress(b"{}\n" * n))
    assert (
        data_file(SimpleNamespace(data=str(tmp_path / "A" / "sg.jsonl.xz")), work).read_bytes()
        == b"{}\n" * 3
    )
    assert (
        data_file(SimpleNamespace(data=str(tmp_path / "B" / "sg.jsonl.xz")), work).read_bytes()
        == b"{}\n" * 11
    )
    cut = tmp_path / "cut.jsonl.xz"
    cut.write_bytes(lzma.compress(b"{}\n" * 50)[:30])
    with pytest.raises(RuntimeError, match=r"--data .*cut.jsonl.xz: expected a complete .xz file"):
        data_file(SimpleNamespace(data=str(cut)), work)


def test_until_stops_after_its_stage_also_when_it_failed(tmp_path):
    from lab.harness import Results, stage

    res = Results(tmp_path, tmp_path, settings={})
    res.until, res.stop = "regen", False

    def boom():
        raise RuntimeError("no manifest")

    assert (
        stage(res, "regen", boom) is None and res.stop and res.until_failed
    )  # gpu_study then exits 1
    assert stage(res, "sweep", lambda: {"ran": True}) is None


def test_speedup_prompts_come_from_assets_when_the_mtbench_wheel_is_missing(
    tmp_path, monkeypatch, tiny_target_dir
):
    """The speedup stage's subprocess gets MT-Bench as prompt ids made in the study's process from
    --assets (a GPU machine without a network has no MT-Bench wheel)."""
    import lzma

    import eagle3.assets as A
    from lab.gpu_study import patch_assets, speedup_prompt_ids
    from eagle3.errors import DataError

    def no_wheel(pkg, rel):
        raise DataError(f"package {pkg!r} is not installed")

    monkeypatch.setattr(
        A, "package_file", no_wheel
    )  # restored after the test, also after patch_assets
    with pytest.raises(DataError, match="is not installed"):
        speedup_prompt_ids(tiny_target_dir, tmp_path / "w0", 2)
    qs = [
        {"question_id": 900 + i, "category": c, "turns": [f"first turn {c}", "second"]}
        for i, c in enumerate(["writing", "math", "coding"])
    ]
    assets = tmp_path / "assets"
    assets.mkdir()
    (assets / "question.jsonl.xz").write_bytes(
        lzma.compress("\n".join(map(json.dumps, qs)).encode())
    )
    patch_assets(assets)
    path = speedup_prompt_ids(tiny_target_dir, tmp_path / "w", 2)
    rows = json.loads(path.read_text())["prompts"]
    assert [r["text"] for r in rows] == ["first turn writing", "first turn math"]
    assert all(
        len(r["input_ids"]) > 3 and all(isinstance(t, int) for t in r["input_ids"]) for r in rows
    )


def test_the_offline_evaluation_reads_gsm8k_from_assets_when_its_wheel_is_missing(
    tmp_path, monkeypatch
):
    """--eval-sets gsm8k<N> on a GPU machine without the GSM8K wheel reads --assets' test.jsonl.xz
    (the evaluation once failed there with 'package ... is not installed')."""
    import lzma

    import eagle3.assets as A
    from eagle3.errors import DataError
    from eagle3.measure.prompts import load_conversations
    from lab.gpu_study import patch_assets

    def no_wheel(pkg, rel):
        raise DataError(f"package {pkg!r} is not installed")

    monkeypatch.setattr(A, "package_file", no_wheel)
    with pytest.raises(DataError, match="is not installed"):
        load_conversations("gsm8k2")
    assets = tmp_path / "assets"
    assets.mkdir()
    rows = [{"question": f"What is {i} + {i}?", "answer": str(2 * i)} for i in range(5)]
    (assets / "test.jsonl.xz").write_bytes(
        lzma.compress("\n".join(map(json.dumps, rows)).encode())
    )
    patch_assets(assets)
    convs = load_conversations("gsm8k2")
    assert len(convs) == 2
    assert all(json.dumps(c).count("What is") == 1 for c in convs)


def _parse_error(argv, capsys):
    from lab.gpu_study import parse_args

    with pytest.raises(SystemExit) as e:
        parse_args(["--device", "cpu", *argv])
    assert e.value.code == 2
    return capsys.readouterr().err


def test_plan_sizes_above_regen_and_bad_overrides_are_refused_when_parsed(tmp_path, capsys):
    """Both used to surface only after the target, data and regen stages (minutes of GPU time), the
    first not at all: a point asking 3,000 regenerated conversations trained on the 8 made and kept
    its label."""
    big = _args(tmp_path, {**PLAN, "points": [["regenerated", 3000, "c"]]}).plan
    assert "needs 3000 regenerated conversations, --regen makes 8" in _parse_error(
        ["--plan", big, "--regen", "8"], capsys
    )
    small = [["regenerated", 5, "c"], ["as-is", 10, "c"]]
    bogus = _args(tmp_path, {**PLAN, "schedules": {"c": ["train.bogus=1"]}, "points": small}).plan
    assert (
        "schedules.c" in (err := _parse_error(["--plan", bogus], capsys)) and "train.bogus" in err
    )
    noeq = _args(
        tmp_path, {**PLAN, "data": {**PLAN["data"], "as-is": ["train.lr"]}, "points": small}
    ).plan
    assert "expected KEY=VALUE strings" in _parse_error(["--plan", noeq], capsys)


def test_assets_folder_without_prompt_files_is_refused(tmp_path, capsys):
    (tmp_path / "empty").mkdir()
    assert "found none" in _parse_error(["--assets", str(tmp_path / "empty")], capsys)


def test_resume_compares_the_plan_contents_not_its_path(tmp_path):
    from lab.study_inputs import plan_digest

    first = plan_digest(_args(tmp_path, PLAN))
    (tmp_path / "copy.json").write_text(json.dumps(PLAN, indent=3))
    assert plan_digest(argparse.Namespace(plan=str(tmp_path / "copy.json"), tiny=False)) == first
    assert plan_digest(_args(tmp_path, {**PLAN, "points": PLAN["points"][:1]})) != first


def test_regen_rounds_reach_the_regeneration_and_a_negative_count_is_refused(monkeypatch, capsys):
    import lab.gpu_study as G

    seen = {}

    def fake_regenerate_file(cfg, out, progress=True):
        seen["rounds"] = cfg.data.regenerate_max_rounds
        return {"counts": {}, "seconds": 0, "answers_per_s": 0, "settings": {}}

    monkeypatch.setattr("eagle3.extract.regen.regenerate_file", fake_regenerate_file)
    for given, want in (("0", None), ("3", 3)):
        a = G.parse_args(["--device", "cpu", "--regen-rounds", given])
        G.do_regen(
            a,
            ["extract.device=cpu", "train.device=cpu", "serve.device=cpu"],
            Path("/tmp/regenerated.jsonl"),
        )
        assert seen["rounds"] == want
    with pytest.raises(SystemExit):
        G.parse_args(["--device", "cpu", "--regen-rounds", "-1"])
    assert "--regen-rounds: expected >= 0 (0: every turn), got -1" in capsys.readouterr().err


def test_regen_max_new_tokens_reaches_the_regeneration_and_bad_values_are_refused(monkeypatch,
                                                                                 capsys):
    import lab.gpu_study as G

    seen = {}

    def fake_regenerate_file(cfg, out, progress=True):
        seen["cap"] = cfg.data.regenerate_max_new_tokens
        return {"counts": {}, "seconds": 0, "answers_per_s": 0, "settings": {}}

    monkeypatch.setattr("eagle3.extract.regen.regenerate_file", fake_regenerate_file)
    base = ["extract.device=cpu", "train.device=cpu", "serve.device=cpu"]
    for argv, want in (([], 512), (["--regen-max-new-tokens", "256"], 256)):
        a = G.parse_args(["--device", "cpu", *argv])
        out = G.do_regen(a, base, Path("/tmp/regenerated.jsonl"))
        assert seen["cap"] == want and "repetition" in out
    for bad in ("0", "40000"):
        with pytest.raises(SystemExit):
            G.parse_args(["--device", "cpu", "--regen-max-new-tokens", bad])
        assert (f"--regen-max-new-tokens: expected 1 to 32768 (data.regenerate_max_new_tokens), "
                f"got {bad}") in capsys.readouterr().err


def _overrides(opts: list[str]) -> dict[str, str]:
    return dict(o.split("=", 1) for o in opts)


@pytest.mark.parametrize(
    "name,regen",
    [("study-at-scale", 11115), ("study-one-session", 1024), ("best-draft-one-session", 3072),
     ("study-one-session-rest", 1), ("best-draft-next", 4096)],
)
def test_the_study_plans_load_and_their_arms_share_a_step_count(name, regen):
    from lab.study_inputs import check_plan, plan_problem
    from tests.conftest import REPO

    plans = {kind: REPO / "lab" / "plans" / f"{name}{kind}.json" for kind in ("", "-tiny")}
    shapes = []
    for kind, path in plans.items():
        plan = check_plan(str(path))
        config = REPO / "configs" / ("tiny-random.yaml" if kind else "smollm2-gpu.yaml")
        a = argparse.Namespace(
            regen=12 if kind else regen,
            all_size=12 if kind else 10915,
            plan=str(path),
            data=None,
            dev_holdout=0,
        )
        assert plan_problem(a, plan, config) is None
        equal = {s: _overrides(o) for s, o in plan["schedules"].items() if s != "constant-100ep"}
        assert len({o["train.max_steps"] for o in equal.values()}) == 1, path
        assert all(o["train.keep_last"] == "1" for o in equal.values())
        # the CPU rehearsal runs the same arms in the same order, at other sizes
        shapes.append([(d, s.split("-n")[0]) for d, _, s in plan["points"]])
    assert shapes[0] == shapes[1]


def test_dev_holdout_keeps_the_last_records_out_of_the_pool(tmp_path):
    from lab.study_inputs import split_dev_holdout

    rows = [
        {
            "id": f"c{i}",
            "conversations": [
                {"from": "human", "value": f"q{i}"},
                {"from": "gpt", "value": f"a{i}"},
            ],
        }
        for i in range(5)
    ]
    rows.append({"id": "c5", "conversations": [{"from": "gpt", "value": "no question"}]})
    src = tmp_path / "sharegpt.jsonl"
    src.write_text("".join(json.dumps(r) + "\n" for r in rows))
    pool, dev = tmp_path / "pool.jsonl", tmp_path / "dev.jsonl"
    counts = split_dev_holdout(src, 3, pool, dev)
    assert counts == {"pool_records": 3, "held_out_records": 3, "dev_prompts": 2, "no_prompt": 1}
    assert pool.read_text().splitlines() == src.read_text().splitlines()[:3]
    assert [json.loads(x) for x in dev.read_text().splitlines()] == [
        {"id": "c3", "category": "sharegpt-dev", "text": "q3"},
        {"id": "c4", "category": "sharegpt-dev", "text": "q4"},
    ]
    assert sorted(p.name for p in tmp_path.iterdir()) == [
        "dev.jsonl",
        "pool.jsonl",
        "sharegpt.jsonl",
    ]
    for n in (0, 6):
        with pytest.raises(ValueError, match=rf"--dev-holdout {n}: expected 1 to 5"):
            split_dev_holdout(src, n, pool, dev)


def test_dev_holdout_points_select_by_the_measured_acceptance(tmp_path):
    from eagle3.config import load_config
    from lab.gpu_study import base_overrides, config_path, parse_args

    a = parse_args(["--tiny", "--device", "cpu", "--dev-holdout", "3", "--dev-prompts", "2"])
    dev = tmp_path / "dev.jsonl"
    dev.write_text('{"text": "q"}\n')
    ov = base_overrides(a, tmp_path, None, tmp_path / "pool.jsonl", dev)
    t = load_config(config_path(a), ov).train
    assert (t.select_best_by, t.dev_prompts_file, t.dev_prompts) == ("measured", str(dev), 2)
    assert "train.select_best_by=measured" not in base_overrides(
        a, tmp_path, None, tmp_path / "pool.jsonl"
    )


def test_resume_refuses_other_inputs_and_stages_whose_files_are_gone(tmp_path):
    from lab.harness import Results

    work, out = tmp_path / "w", tmp_path / "o"
    res = Results(work, out, settings={"regen_rounds": 1, "data": "/a.jsonl"})
    kept = work / "regenerated.jsonl"
    kept.parent.mkdir(parents=True, exist_ok=True)
    kept.write_text("{}\n")
    res.put("regen", {"path": str(kept)})
    res.put("data", {"dir": str(work), "dev_prompts_file": str(work / "dev.jsonl")})
    with pytest.raises(SystemExit, match=r"data: .*dev.jsonl"):  # the dev prompts are gone
        Results(work, out, resume=True, settings={"regen_rounds": 1, "data": "/a.jsonl"})
    (work / "dev.jsonl").write_text("{}\n")
    with pytest.raises(SystemExit, match=r"other settings .*'regen_rounds': \(1, 0\)"):
        Results(work, out, resume=True, settings={"regen_rounds": 0, "data": "/a.jsonl"})
    kept.unlink()
    with pytest.raises(SystemExit, match=r"regen: .*regenerated.jsonl"):
        Results(work, out, resume=True, settings={"regen_rounds": 1, "data": "/a.jsonl"})
    (work / "results.json").write_text(json.dumps({"stages": [1, 2]}))
    with pytest.raises(SystemExit, match=r"expected an object with a 'stages' object, got list"):
        Results(work, out, resume=True)


def test_a_point_given_twice_and_too_many_dev_prompts_are_refused(tmp_path, capsys):
    from lab.gpu_study import parse_args
    from lab.study_inputs import check_plan

    f = tmp_path / "plan.json"
    f.write_text(json.dumps({**PLAN, "points": [["as-is", 10, "c"], ["as-is", 10, "c"]]}))
    with pytest.raises(
        ValueError,
        match=r"points\[1\] = \['as-is', 10, 'c'\]: expected each "
        r"point once, got it also at points\[0\]",
    ):
        check_plan(str(f))
    with pytest.raises(SystemExit):
        parse_args(["--device", "cpu", "--dev-holdout", "4", "--dev-prompts", "5000"])
    assert "--dev-prompts: expected >= 0 / 1 to 4096, got 4 / 5000" in capsys.readouterr().err


@pytest.mark.parametrize(
    "overrides, shown",
    [
        (["data.num_conversations=5"], "['data.num_conversations']"),
        (["paths.runs_dir=/x"], "['paths.runs_dir']"),
        (["train.epochs=1", "train.epochs=2"], "['train.epochs']"),
    ],
)
def test_a_plan_override_the_study_owns_or_gives_twice_is_refused(tmp_path, overrides, shown):
    from lab.study_inputs import check_plan

    f = tmp_path / "plan.json"
    f.write_text(json.dumps({**PLAN, "schedules": {"c": overrides}}))
    with pytest.raises(
        ValueError,
        match=r"schedules.c: expected no override of "
        r"data.num_conversations, name or paths.\*",
    ):
        check_plan(str(f))
    with pytest.raises(ValueError) as e:
        check_plan(str(f))
    assert str(e.value).endswith(f"got {shown}")


def test_stages_after_until_are_not_reported_as_done(tmp_path, capsys):
    from lab.harness import Results, stage

    res = Results(tmp_path, tmp_path, settings={})
    res.put("report", {"file": "r.md"})
    res.put("speedup", {"file": "s.json"})
    res.until, res.stop = "report", False
    assert stage(res, "report", lambda: {}) == {"file": "r.md"} and res.stop
    stage(res, "speedup", lambda: {})
    out = capsys.readouterr().out
    assert "report: done in an earlier call" in out and "stopping after report" in out
    assert "speedup" not in out


def test_a_plan_key_given_twice_and_a_holdout_as_large_as_data_are_refused(tmp_path, capsys):
    import lzma

    from lab.gpu_study import parse_args

    f = tmp_path / "plan.json"
    text = json.dumps(PLAN)
    f.write_text(text[:-1] + ', "points": [["as-is", 10, "c"]]}')  # "points" twice
    with pytest.raises(SystemExit):
        parse_args(["--device", "cpu", "--plan", str(f)])
    assert "key 'points' given twice in one object" in capsys.readouterr().err
    data = tmp_path / "d.jsonl.xz"
    data.write_bytes(lzma.compress(b'{"id": "a"}\n\n{"id": "b"}\n{"id": "c"}\n'))
    with pytest.raises(SystemExit):
        parse_args(["--device", "cpu", "--data", str(data), "--dev-holdout", "3"])
    assert (
        f"--dev-holdout 3: expected 1 to 2 (the records of --data {data} less one), got 3"
        in capsys.readouterr().err
    )


@pytest.mark.parametrize(
    "content, shown",
    [
        (
            b"\xfd7zXZ\x00 cut",
            "--data {f}: expected a readable UTF-8 JSONL file (plain, .gz or .xz)",
        ),
        (
            b"",
            "expected --data {f} to hold at least 2 records (one held out, one to train on), got 0",
        ),
        (b'{"id": "\xe9"}\n{}\n', "--data {f}: expected a readable UTF-8 JSONL file"),
        (
            b'{"id": "a", "conversations": [{"from": "human", "value": "q"}]}\n'
            b'{"id": "b", "conversations": [{"from": "gpt", "value": "no question"}]}\n',
            "--dev-holdout 1: expected the last 1 records of {f} to hold a user turn",
        ),
    ],
)
def test_a_data_file_that_cannot_hold_out_is_refused_in_one_line(tmp_path, capsys, content, shown):
    from lab.gpu_study import parse_args

    f = tmp_path / ("d.jsonl.xz" if content.startswith(b"\xfd7z") else "d.jsonl")
    f.write_bytes(content)
    with pytest.raises(SystemExit):
        parse_args(["--device", "cpu", "--data", str(f), "--dev-holdout", "1"])
    err = capsys.readouterr().err
    assert shown.format(f=f) in err and "Traceback" not in err


@pytest.mark.parametrize(
    "change, shown",
    [
        ({"points": [[["as-is"], 10, "c"]]}, "points[0] = [['as-is'], 10, 'c']: expected [data in"),
        (
            {"pionts": []},
            "expected the keys data, schedules, points and an optional about, got also ['pionts']",
        ),
        (
            {"data": {"as-is": ["train.epochs=2"]}, "points": [["as-is", 10, "c"]]},
            "points[0] = ['as-is', 10, 'c']: expected data.as-is and schedules.c to set "
            "different keys (the schedule's would win silently), got both setting "
            "['train.epochs']",
        ),
    ],
)
def test_a_plan_whose_points_or_keys_mislead_is_refused(tmp_path, change, shown):
    from lab.study_inputs import check_plan

    f = tmp_path / "plan.json"
    f.write_text(json.dumps({**PLAN, **change}))
    with pytest.raises(ValueError) as e:
        check_plan(str(f))
    assert shown in str(e.value)


def test_a_plan_the_config_refuses_is_named_in_one_line(tmp_path):
    from lab.gpu_study import config_path, parse_args
    from lab.study_inputs import check_plan, plan_problem

    f = tmp_path / "plan.json"
    f.write_text(
        json.dumps({**PLAN, "schedules": {"c": ["train.epochz=1"]}, "points": [["as-is", 10, "c"]]})
    )
    a = parse_args(["--tiny", "--device", "cpu"])
    a.plan = str(f)
    problem = plan_problem(a, check_plan(str(f)), config_path(a))
    assert problem.startswith(f"--plan {f}: schedules.c: ") and "train.epochz" in problem
    assert "\n" not in problem


def test_points_asking_more_than_data_holds_after_the_holdout_are_refused(tmp_path, capsys):
    from lab.gpu_study import parse_args

    data = tmp_path / "d.jsonl"
    turns = [{"from": "human", "value": "q"}, {"from": "gpt", "value": "a"}]
    data.write_text((json.dumps({"id": "a", "conversations": turns}) + "\n") * 10)
    plan = _args(tmp_path, {**PLAN, "points": [["as-is", 8, "c"]]}).plan
    parse_args(["--device", "cpu", "--plan", plan, "--data", str(data), "--dev-holdout", "2"])
    with pytest.raises(SystemExit):
        parse_args(["--device", "cpu", "--plan", plan, "--data", str(data), "--dev-holdout", "3"])
    assert (
        f"point ['as-is', 8, 'c'] needs 8 conversations, --data {data} holds 7 records after "
        "--dev-holdout 3" in capsys.readouterr().err
    )
    regen = _args(tmp_path, {**PLAN, "points": [["regenerated", 5, "c"]]}).plan
    with pytest.raises(SystemExit):
        parse_args(["--device", "cpu", "--plan", regen, "--data", str(data), "--regen", "12"])
    assert "needs 12 conversations to regenerate, --data " in capsys.readouterr().err


def test_the_steps_plan_goes_on_from_the_short_plans_store():
    """best-draft-steps.json adds a longer schedule to best-draft-short.json's point: the store
    copy of that point is accepted (same data and schedule overrides) and only the new one runs."""
    from lab.study_inputs import check_plan
    from lab.study_store import store_problem
    from tests.conftest import REPO

    plans = REPO / "lab" / "plans"
    short = check_plan(str(plans / "best-draft-short.json"))
    steps = check_plan(str(plans / "best-draft-steps.json"))
    assert steps["points"][0] == short["points"][0]
    steps_of = {s: int(_overrides(o)["train.max_steps"]) for s, o in steps["schedules"].items()}
    assert steps_of == {"cosine-s14k-n2000-v32k": 14000, "cosine-s28k-n2000-v32k": 28000}
    tiny = check_plan(str(plans / "best-draft-steps-tiny.json"))
    assert [s.split("-n")[0] for _, _, s in tiny["points"]] == [
        s.split("-n")[0] for _, _, s in steps["points"]]
    store = REPO / "lab" / "results" / "2026-12-07-h100-best-draft" / "mlflow_store.tar.xz"
    work = Path("/tmp/h200/study")  # the copy's --work: the store records absolute paths
    assert store_problem(store, work, steps) is None
    changed = json.loads(json.dumps(steps))
    changed["schedules"]["cosine-s14k-n2000-v32k"][1] = "train.epochs=10"
    assert "was" in store_problem(store, work, changed)


def test_a_regen_file_is_checked_before_any_stage(tmp_path, capsys):
    """``--regen-file`` made with every turn regenerated is refused for ``--regen-rounds 1``, a
    missing manifest and another ``--regen`` count too, at argument parsing: no stage runs, no
    store is unpacked into ``--work``."""
    from lab.gpu_study import _manifest_of, parse_args, regen_file_problem

    src = _regen(tmp_path, made_for=12)  # --tiny's --regen
    man = json.loads(_manifest_of(src).read_text())
    man["settings"]["max_rounds"] = None  # every turn (--regen-rounds 0)
    _manifest_of(src).write_text(json.dumps(man))
    assert regen_file_problem(src, 12, None, 0) is None
    assert regen_file_problem(src, 12, None, 1) == (
        f"--regen-file {src}: {_manifest_of(src)} settings.max_rounds is None (every turn), "
        "expected --regen-rounds 1 (--regen-rounds 0 for this file)")
    work = tmp_path / "w"
    base = ["--tiny", "--device", "cpu", "--work", str(work), "--regen-file", str(src)]
    with pytest.raises(SystemExit):
        parse_args([*base, "--regen-rounds", "1"])
    assert "settings.max_rounds is None (every turn)" in capsys.readouterr().err
    _manifest_of(src).unlink()
    with pytest.raises(SystemExit):
        parse_args([*base, "--regen-rounds", "0"])
    assert "expected its manifest" in capsys.readouterr().err
    assert not work.exists()
