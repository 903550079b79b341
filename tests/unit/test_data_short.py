"""An extraction that gets fewer usable conversations than ``data.num_conversations`` asks says
so (``DATA_SHORT``): a data-scaling point would otherwise be labelled with a size it never had."""

import json
import logging

from eagle3.config import load_config
from eagle3.extract.stage import extract
from tests.conftest import CONFIGS


def _file(path, n):
    path.write_text(
        "".join(
            json.dumps(
                {
                    "id": f"c{i}",
                    "conversations": [
                        {"from": "human", "value": f"question {i}?"},
                        {"from": "gpt", "value": f"answer number {i}."},
                    ],
                }
            )
            + "\n"
            for i in range(n)
        )
    )
    return path


def _extract(tmp_path, n_asked, caplog):
    cfg = load_config(
        CONFIGS / "tiny-random.yaml",
        [
            f"paths.runs_dir={tmp_path / 'runs'}",
            "data.source=file",
            f"data.path={_file(tmp_path / 'five.jsonl', 5)}",
            f"data.num_conversations={n_asked}",
            "data.max_seq_len=64",
        ],
    )
    with caplog.at_level(logging.WARNING, logger="eagle3.extract.stage"):
        m = extract(cfg, tmp_path / f"x{n_asked}", progress=False)
    return m, [r.getMessage() for r in caplog.records if "DATA_SHORT" in r.getMessage()]


def test_fewer_conversations_than_asked_is_said(tmp_path, caplog):
    m, said = _extract(tmp_path, 12, caplog)
    assert m["counts"]["samples"] == 5
    assert len(said) == 1 and said[0].startswith(
        f"DATA_SHORT: data.num_conversations=12 asked, {tmp_path / 'five.jsonl'} gives 5 usable "
        "conversations (5 records, 0 skipped: {})"
    )


def test_as_many_as_asked_is_not(tmp_path, caplog):
    m, said = _extract(tmp_path, 5, caplog)
    assert m["counts"]["samples"] == 5 and said == []
