"""Dataset preparation: each benchmark's real field names, MATH from ../shared/data, malformed
rows named by file and line, templates, synthetic arithmetic, Level3-500 selection."""

import json
import random
import subprocess
import sys

import pytest
from helpers import FIXTURES, shared_file

from avspo_openrlhf.cli.prepare_data import build_parser, main
from avspo_openrlhf.data.io import DataError, load_local, read_jsonl
from avspo_openrlhf.data.sources import SOURCES
from avspo_openrlhf.data.tasks import (
    ARITH_LEVELS,
    PAPER_SYSTEM_PROMPT,
    level3_proxy,
    make_prompt,
    select_by_accuracy,
    synthetic_arithmetic,
)
from avspo_openrlhf.rewards import verify_answer

SCHEMA = {"problem", "answer", "source", "level", "subject", "unique_id", "solution"}


@pytest.mark.parametrize(
    "name, answers",
    [
        ("gsm8k", ["72", "10", "2400"]),
        ("minerva", ["1.6", "3e8"]),
        ("olympiadbench", ["2", "$(6,3),(9,3),(9,5),(54,5)$"]),
        ("amc", ["3", "7.105"]),
        ("aime24", ["204", "025"]),
        ("mmlu_pro", ["D", "B"]),
    ],
)
def test_fixture_sources_convert(name, answers):
    rows = load_local(str(FIXTURES / f"{name}.jsonl"), name).rows
    assert [r["answer"] for r in rows] == answers
    for r in rows:
        assert SCHEMA <= set(r) and r["problem"] and r["source"] == name and r["unique_id"]
    if name == "mmlu_pro":
        assert rows[1]["choices"] == ["3", "4", "5"] and "(B) 4" in rows[1]["problem"]


@pytest.mark.slow
def test_math_from_shared_data():
    # two MATH-train solutions end in an empty \boxed{}: reported by line, never dropped silently
    with pytest.raises(DataError, match=r"math_train.jsonl:5342: no 'answer'"):
        load_local(shared_file("math_train.jsonl"), "math_train")
    report = load_local(shared_file("math_train.jsonl"), "math_train", skip_bad_rows=True)
    train = report.rows
    assert [s.split(":")[1] for s in report.skipped] == ["5342", "5344"]
    test = load_local(shared_file("math_test.jsonl"), "math_test").rows
    m500 = load_local(shared_file("math500.jsonl"), "math500").rows
    assert (len(train), len(test), len(m500)) == (7498, 5000, 500)
    assert {r["level"] for r in train} >= {f"Level {i}" for i in range(1, 6)}  # plus a few "Level ?"
    assert m500[0]["level"] == "Level 2" and m500[0]["subject"] == "Precalculus"
    # the extracted gold answer verifies against its own solution
    for r in random.Random(0).sample(train, 50):
        assert verify_answer(r["solution"], r["answer"]).status == "correct", r["unique_id"]


def test_malformed_rows_are_named_by_file_and_line():
    path = str(FIXTURES / "bad_rows.jsonl")
    with pytest.raises(DataError, match=r"bad_rows.jsonl:2: no 'answer' field"):
        load_local(path, "math_train")
    report = load_local(path, "math_train", skip_bad_rows=True)
    assert [r["answer"] for r in report.rows] == ["2", "5"]
    reasons = [s.split(": ", 1)[0].rsplit(":", 1)[1] + ":" + s.split(": ", 1)[1] for s in report.skipped]
    assert [r.split(":")[0] for r in reasons] == ["2", "3", "4", "5"]
    assert "empty" in report.skipped[1] and "broken JSON" in report.skipped[2] and "list" in report.skipped[3]
    assert "4 bad rows skipped" in report.summary()


def test_wrong_types_and_json_list(tmp_path):
    p = tmp_path / "rows.json"
    p.write_text(json.dumps([{"question": "q", "answer": "x\n#### 3"}, {"question": 5, "answer": None}]))
    with pytest.raises(DataError, match=r"rows.json:2: missing field 'answer'|rows.json:2: field"):
        load_local(str(p), "gsm8k")
    p.write_text("[1, 2")
    with pytest.raises(DataError, match="broken JSON"):
        load_local(str(p), "gsm8k")


def test_templates():
    msgs = make_prompt("What is 1+1?", "paper")
    assert msgs == [{"role": "system", "content": PAPER_SYSTEM_PROMPT}, {"role": "user", "content": "What is 1+1?"}]
    assert make_prompt("Q", "plain").startswith("Question: Q\n") and make_prompt("Q", "none") == "Q"
    with pytest.raises(ValueError):
        make_prompt("Q", "fancy")


def test_synthetic_arithmetic_is_seeded_and_exact():
    a, b = synthetic_arithmetic(40, seed=3), synthetic_arithmetic(40, seed=3)
    assert a == b and a != synthetic_arithmetic(40, seed=4)
    assert {r["level"] for r in a} == set(ARITH_LEVELS)
    for r in a:
        expr = r["problem"].removeprefix("What is ").removesuffix("?")
        assert str(eval(expr)) == r["answer"]  # noqa: S307 - our own generated arithmetic
        assert verify_answer(f"\\boxed{{{r['answer']}}}", r["answer"]).status == "correct"
    with pytest.raises(ValueError, match="unknown arithmetic levels"):
        synthetic_arithmetic(3, ["add9"])


def test_level3_proxy_and_selection():
    train = load_local(shared_file("math_train.jsonl"), "math_train", skip_bad_rows=True).rows
    proxy = level3_proxy(train, 500, seed=0)
    assert len(proxy) == 500 and {r["level"] for r in proxy} == {"Level 3"} and proxy[0]["source"] == "level3_proxy"
    assert proxy == level3_proxy(train, 500, seed=0) and len({r["unique_id"] for r in proxy}) == 500

    rows = synthetic_arithmetic(40, ["add1"], seed=0)
    truth = {r["unique_id"]: i % 5 for i, r in enumerate(rows)}  # problem i: (i % 5) of 4 samples right

    def sample(rs, k):
        return [
            [f"\\boxed{{{r['answer']}}}" if j < truth[r["unique_id"]] else "\\boxed{-1}" for j in range(k)] for r in rs
        ]

    def score(completions, golds):
        return [verify_answer(c, g).reward for c, g in zip(completions, golds)]

    picked = select_by_accuracy(rows, sample, score, k=4, band=(0.25, 0.5), n=10, seed=1)
    assert len(picked) == 10 and {r["selector_accuracy"] for r in picked} <= {0.25, 0.5}
    assert picked == select_by_accuracy(rows, sample, score, k=4, band=(0.25, 0.5), n=10, seed=1)
    with pytest.raises(ValueError, match="only 16 problems"):
        select_by_accuracy(rows, sample, score, k=4, band=(0.25, 0.5), n=17)


def test_cli_prepare_offline_and_arithmetic(tmp_path, capsys):
    out = tmp_path / "m500.jsonl"
    assert (
        main(["prepare", "math500", "--input", shared_file("math500.jsonl"), "--output", str(out), "--limit", "20"])
        == 0
    )
    rows = read_jsonl(str(out))
    assert len(rows) == 20 and rows[0]["prompt"][0]["content"] == PAPER_SYSTEM_PROMPT
    out2 = tmp_path / "arith.jsonl"
    assert main(["arithmetic", "--n", "16", "--template", "plain", "--output", str(out2)]) == 0
    assert isinstance(read_jsonl(str(out2))[0]["prompt"], str)
    assert (
        main(
            [
                "prepare",
                "math_train",
                "--input",
                str(FIXTURES / "bad_rows.jsonl"),
                "--output",
                str(tmp_path / "x.jsonl"),
            ]
        )
        == 2
    )
    assert "bad_rows.jsonl:2" in capsys.readouterr().err


def test_cli_help_documents_every_option():
    parser = build_parser()
    subs = parser._subparsers._group_actions[0].choices
    assert set(subs) == {"prepare", "arithmetic", "level3-proxy", "level3-select"}
    for name, sub in subs.items():
        for action in sub._actions:
            if action.dest != "help":
                assert action.help, f"{name} --{action.dest} has no help"
    out = subprocess.run(
        [sys.executable, "-m", "avspo_openrlhf.cli.prepare_data", "prepare", "--help"], capture_output=True, text=True
    )
    assert out.returncode == 0 and "--skip-bad-rows" in out.stdout
    assert all(name in out.stdout for name in SOURCES)
