"""``eagle3 doctor``: one line per check; a configured but unreachable server is a FAIL."""

from __future__ import annotations

import socket

from eagle3.doctor import run_doctor


def _closed_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]  # closed again when the block ends: nothing listens there


def test_doctor_reports_each_check_and_fails_on_a_configured_dead_server(monkeypatch):
    monkeypatch.delenv("PREFECT_API_URL", raising=False)
    monkeypatch.setenv("MLFLOW_TRACKING_URI", f"http://127.0.0.1:{_closed_port()}")
    lines: list[str] = []
    ok = run_doctor(echo=lines.append)
    text = "\n".join(lines)
    assert not ok
    assert any(
        ln.startswith("FAIL") and "MLflow server configured by MLFLOW_TRACKING_URI" in ln
        for ln in lines
    )
    assert "torch " in text and "SGLang" in text and "GiB free" in text
    assert any(
        "Prefect" in ln and ln.startswith("OK") for ln in lines
    )  # not configured: ephemeral API


def test_doctor_passes_with_a_local_store(monkeypatch, tmp_path):
    monkeypatch.delenv("PREFECT_API_URL", raising=False)
    monkeypatch.setenv("MLFLOW_TRACKING_URI", f"sqlite:///{tmp_path / 'mlflow.db'}")
    lines: list[str] = []
    assert run_doctor(echo=lines.append), "\n".join(lines)
    assert any("a local store, no server needed" in ln for ln in lines)


def test_doctor_says_which_cpu_features_it_found_and_what_auto_resolves_to(monkeypatch):
    import torch

    from eagle3 import precision
    from eagle3.doctor import check_precision

    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    for ratio, dtype, prec in ((0.021, "float32", "float32"), (6.0, "bfloat16", "bf16-autocast")):
        probe = precision.Bf16Probe(
            float32_gflops=43.0,
            bfloat16_gflops=43.0 * ratio,
            threads=1,
            capability="AVX2",
            features={"avx2": True, "avx512_bf16": False},
            isa_env={"ONEDNN_MAX_CPU_ISA": "AVX2"},
        )
        monkeypatch.setattr(precision, "probe_cpu_bf16", lambda: probe)
        status, text = check_precision()
        assert status == "OK"
        assert (
            "torch capability AVX2" in text
            and "flags avx2;" in text
            and "ONEDNN_MAX_CPU_ISA=AVX2" in text
        )
        assert f"({ratio:.3f}×" in text and "GFLOP/s vs float32 43.0 GFLOP/s" in text
        assert f"dtype auto = {dtype}, train.precision auto = {prec}" in text


def _fake_python(tmp_path, name, body):
    p = tmp_path / name
    p.write_text(f"#!/bin/sh\n{body}\n")
    p.chmod(0o755)
    return str(p)


def test_doctor_reads_the_serving_interpreters_sglang_against_the_pinned_releases(tmp_path):
    from eagle3.doctor import check_sglang
    from eagle3.engines.sglang.profile import RELEASES, VERSION

    other = next(v for v in RELEASES if v != VERSION)
    status, text = check_sglang(_fake_python(tmp_path, "py_pinned", f"echo {other}"))
    assert status in ("OK", "WARN") and f"SGLang {other} in" in text
    assert f"convert.engine_version: '{other}'" in text
    status, text = check_sglang(_fake_python(tmp_path, "py_new", "echo 0.9.1"))
    assert status == "WARN" and "not a pinned release" in text and VERSION in text
    status, text = check_sglang(_fake_python(tmp_path, "py_none", "exit 1"))
    assert status == "FAIL" and "cannot import sglang" in text


def test_doctor_says_why_the_sglang_python_cannot_run(tmp_path):
    from eagle3.doctor import check_sglang

    missing = tmp_path / "nowhere" / "python"
    status, text = check_sglang(str(missing))
    assert status == "FAIL" and f"{missing}: " in text and "a path that does not exist" in text
    env = tmp_path / "venv"
    (env / "bin").mkdir(parents=True)
    status, text = check_sglang(str(env))
    assert status == "FAIL" and f"{env}: " in text and "got a directory" in text
    (env / "bin" / "python").write_text("#!/bin/sh\n")
    (env / "bin" / "python").chmod(0o644)
    status, text = check_sglang(str(env))
    assert f"did you mean {env / 'bin' / 'python'}?" in text
    status, text = check_sglang(str(env / "bin" / "python"))
    assert status == "FAIL" and f"{env / 'bin' / 'python'}: " in text
    assert "without execute permission" in text


def test_cli_doctor_names_the_bad_sglang_python(tmp_path, monkeypatch):
    from typer.testing import CliRunner

    import eagle3.doctor as doctor
    from cli.main import app

    monkeypatch.setattr(doctor, "check_server", lambda name, *a: ("OK", name))
    out = CliRunner().invoke(app, ["doctor", "--sglang-python", str(tmp_path)])
    assert out.exit_code == 1
    assert f"FAIL SGLang: --sglang-python {tmp_path}: expected the Python interpreter" in out.output
    assert "got a directory" in out.output


def test_doctor_fails_when_the_sglang_python_answers_with_something_not_a_version(tmp_path):
    from eagle3.doctor import check_sglang

    for body, shown in (
        ("echo hello", "'hello'"),
        ("echo 'Usage: tool [options]'", "'Usage: tool [options]'"),
    ):
        py = _fake_python(tmp_path, "py_" + str(len(body)), body)
        status, text = check_sglang(py)
        assert status == "FAIL", text
        assert f"--sglang-python {py}: expected a version string" in text and f"got {shown}" in text
    for version in ("0.5.0rc2", "0.4.6.post1", "0.5.1+cu128"):
        status, text = check_sglang(_fake_python(tmp_path, "py_ok", f"echo {version}"))
        assert f"SGLang {version} in" in text, text


def test_doctor_reports_an_empty_sglang_python_as_empty_not_as_a_directory(tmp_path, monkeypatch):
    from typer.testing import CliRunner

    import eagle3.doctor as doctor
    from cli.main import app

    for value in ("", "  "):
        status, text = doctor.check_sglang(value)
        assert status == "FAIL" and "got an empty value" in text and "directory" not in text
    monkeypatch.setattr(doctor, "check_server", lambda name, *a: ("OK", name))
    out = CliRunner().invoke(app, ["doctor", "--sglang-python", ""])
    assert out.exit_code == 1
    expected = "FAIL SGLang: --sglang-python '': expected the path of the Python interpreter"
    assert expected in out.output


def test_a_bare_interpreter_name_asks_for_its_full_path(tmp_path, monkeypatch):
    from eagle3.doctor import interpreter_problem

    monkeypatch.chdir(tmp_path)  # no file of that name here
    why = interpreter_problem("python3")
    assert "give its full path" in why
    assert "bare name" not in (interpreter_problem(str(tmp_path / "nope")) or "")
