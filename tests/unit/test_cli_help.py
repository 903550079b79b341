"""``eagle3 --help`` and every subcommand's help read as plain text: no reStructuredText markup
(double backticks, :class:/:func: roles) from the docstrings typer shows."""

from __future__ import annotations

import re

import pytest
from typer.main import get_command
from typer.testing import CliRunner

from cli.main import app

MARKUP = re.compile(r"``|:(class|func|mod|data|meth|attr):`")
COMMANDS = sorted(get_command(app).commands)


@pytest.mark.parametrize(
    "argv", [["--help"]] + [[c, "--help"] for c in COMMANDS], ids=lambda a: " ".join(a)
)
def test_help_has_no_docstring_markup(argv):
    out = CliRunner().invoke(app, argv, terminal_width=200)
    assert out.exit_code == 0, out.output
    bad = [line.strip() for line in out.output.splitlines() if MARKUP.search(line)]
    assert bad == [], f"eagle3 {' '.join(argv)}: markup in {bad}"


def test_every_command_is_covered():
    assert {
        "run",
        "convert",
        "validate",
        "bench",
        "preflight",
        "regenerate",
        "wait-ready",
        "doctor",
    } <= set(COMMANDS)
