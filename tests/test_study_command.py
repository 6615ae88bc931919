"""``avspo-study`` (study/command.py, study/task.py): a user's plan as the decision plan, and every
mistake of the plan, the task, the reward, the memory or the run folder refused in one line before
anything trains. The end-to-end run (a user's jsonl and reward, a plugin's remedy as an arm, no verdict
from 2 seeds nor from a remedy that never acted) is docs/study.md's example, run by the docs tests."""

from __future__ import annotations

import json
import re
from pathlib import Path

import pytest

from avspo_openrlhf.study import command
from avspo_openrlhf.study.compare import fewest_seeds
from avspo_openrlhf.study.remedies_gpu import GPURemediesStudy
from avspo_openrlhf.study.remedies_gpu_report import acted
from avspo_openrlhf.study.spec import Arm, StudySettings
from avspo_openrlhf.study.task import Task, TaskError, normalize_reward, reward_function

REWARD = """
def score(completion, answer):
    return float(answer in completion)
"""


@pytest.fixture
def task(tmp_path, monkeypatch) -> Path:
    """A folder with 30 word problems (fields question/target/hardness) and a reward file, as cwd."""
    monkeypatch.chdir(tmp_path)
    with open("problems.jsonl", "w") as f:
        for k in range(30):
            row = {"question": f"What is {k} plus {k + 1}?", "target": str(2 * k + 1), "hardness": "ab"[k % 2]}
            f.write(json.dumps(row) + "\n")
    Path("reward.py").write_text(REWARD)
    return tmp_path


BASE = [
    "--model", "tiny", "--task", "problems.jsonl", "--prompt-field", "question", "--answer-field", "target",
    "--reward", "reward.py:score", "--arms", "grpo", "avspo", "--seeds", "2", "--budget", "500",
    "--heldout-size", "6", "--out", "runs/x", "--dry-run",
]  # fmt: skip


def study(argv: list[str], capsys) -> tuple[int, str, str]:
    rc = command.main(argv)
    out, err = capsys.readouterr()
    return rc, out, err


@pytest.mark.parametrize(
    "change, said",
    [
        ({"--arms": ["grpo", "avspoo"]}, "--arms avspoo: unknown remedy 'avspoo'; known: "),
        ({"--arms": ["grpo", "grpo"]}, "two arms share a label"),
        ({"--arms": ["grpo", "avspo:strategy=bogus"]}, "--arms avspo:strategy=bogus: Arm.options['strategy']"),
        ({"--baseline": ["sign"]}, "--baseline sign: not one of the arms (grpo, avspo)"),
        ({"--seeds": ["1"]}, "--seeds: at least 2"),
        ({"--budget": ["0"]}, "StudySettings.token_budget must be an integer >= 1, got 0"),
        ({"--model": ["no/such/folder"]}, "--model: no/such/folder is not smollm2, tiny or a local HF folder"),
        ({"--reward": ["avspo:maths"]}, "--reward avspo:maths: unknown; the built-in rewards are arith, math"),
        ({"--reward": ["nofile.py:score"]}, "--reward nofile.py:score: no such file: nofile.py"),
        ({"--reward": ["no_such_module_xyz:score"]}, "cannot import no_such_module_xyz (ModuleNotFoundError"),
        ({"--reward": ["reward.py:scor"]}, "has no function 'scor'"),
        ({"--answer-field": ["answer"]}, "problems.jsonl:1: the row has no 'answer' (--answer-field)"),
        ({"--task": ["missing.jsonl"]}, "--task: no such file: missing.jsonl"),
        ({"--k": ["100000"]}, "--k 100000: 100000 runs need about "),
        ({"--k": ["0"]}, "--k: at least 1 run at once, got 0"),
        ({"--shard": ["3/2"]}, "--shard: I/N with 0 <= I < N, got '3/2'"),
    ],
)
def test_each_mistake_fails_in_one_line_before_anything_trains(task, capsys, change, said):
    argv = list(BASE)
    for flag, values in change.items():
        if flag not in argv:
            argv += [flag, *values]
            continue
        i = argv.index(flag)
        j = i + 1
        while j < len(argv) and not argv[j].startswith("--"):
            j += 1
        argv[i + 1 : j] = values
    rc, out, err = study(argv, capsys)
    assert rc == 2, out
    said_lines = [line for line in err.splitlines() if line.startswith("avspo-study: ")]
    assert len(said_lines) == 1 and said in said_lines[0], err
    assert not list(Path("runs").glob("x/*_seed*")), "a run folder was made"


def test_a_reward_outside_its_range_or_raising_fails_in_the_dry_run(task, capsys):
    Path("reward.py").write_text("def score(completion, answer):\n    return 2.0 if completion else 0.0\n")
    rc, _, err = study(BASE, capsys)
    assert rc == 2 and re.search(r"returned 2.0 for the completion 'The answer is \d+.'.*\[0, 1\]", err), err
    rc, out, _ = study([*BASE, "--reward-range", "0", "2", "--out", "runs/y"], capsys)  # declared: it passes
    assert rc == 0 and "on 'The answer is <answer>.'" in out and "(range 0..2)" in out, out
    Path("reward.py").write_text("def score(completion, answer):\n    return 1 / 0\n")
    rc, _, err = study([*BASE, "--out", "runs/z"], capsys)
    assert rc == 2 and "reward.py:score: raised ZeroDivisionError: division by zero" in err, err


def test_the_dry_run_says_what_it_checked_and_the_plan_it_would_run(task, capsys):
    rc, out, err = study([*BASE, "--level-field", "hardness"], capsys)
    assert rc == 0, err
    assert "[study] rows: 24 training problems, 6 held-out (2 levels: a, b)" in out
    assert "model: qwen2; memory: about " in out and "GiB free" in out
    assert re.search(r"time: a probe step of grpo took [\d.]+ s for [\d,]+ generated tokens .* about \d+ steps", out)
    # the evaluation is in the estimate: the final one over the 6 held-out problems, sampled and greedy
    m = re.search(
        r"a held-out completion ([\d.]+) s \(a batch of 6\): about \d+ steps \(.*?\) and ([\d,]+) evaluated", out
    )
    assert m and float(m[1]) > 0 and int(m[2].replace(",", "")) >= 6, out
    assert "4 runs to start (shard 0/1, 0 finished): grpo seed 0, avspo seed 0, grpo seed 1, avspo seed 1" in out
    rows = [json.loads(x) for x in Path("runs/x/data/heldout.jsonl").read_text().splitlines()]
    train = {json.loads(x)["problem"] for x in Path("runs/x/data/train.jsonl").read_text().splitlines()}
    assert not train & {r["problem"] for r in rows}  # held out: never a training problem
    assert all(
        r["unique_id"] == f"heldout/{r['level']}/{k}" for r in rows for k in [int(r["unique_id"].split("/")[-1])]
    )


def test_a_folder_of_other_settings_or_an_edited_reward_is_refused_naming_the_difference(task, capsys):
    assert study(BASE, capsys)[0] == 0
    rc, out, _ = study(BASE, capsys)  # the same plan again: accepted (a rerun resumes)
    assert rc == 0 and "the same settings as its runs so far" in out
    rc, _, err = study([*BASE, "--lr", "2e-5"], capsys)
    assert rc == 2 and "runs/x holds runs of other settings (settings.lr" in err, err
    Path("reward.py").write_text(REWARD + "\n# edited\n")
    rc, _, err = study(BASE, capsys)
    assert rc == 2 and "reward_source" in err, err


def test_reward_names_share_avspo_trains_space(tmp_path):
    assert normalize_reward("avspo:arith") == normalize_reward("arith") == "arith"
    assert normalize_reward("avspo:math") == "math"
    f = tmp_path / "r.py"
    f.write_text("def s(c, a):\n    return 0.5\n")
    name = normalize_reward(f"{f}:s")
    assert name == f"{f.resolve()}:s" and reward_function(name)(["x"], ["1"]) == [0.5]
    rows = [{"problem": "p", "answer": "1"}]
    assert "0.50 on an empty completion" in Task(train=str(f), reward=name).check_reward(rows)
    with pytest.raises(TaskError, match=r"returned 0.5 .* outside its range \[0, 0.4\]"):
        Task(train=str(f), reward=name, reward_range=(0.0, 0.4)).check_reward(rows)
    with pytest.raises(TaskError, match="not arith, math"):
        normalize_reward("nonsense")


def test_a_split_without_heldout_is_disjoint_and_seeded(tmp_path):
    src = tmp_path / "p.jsonl"
    src.write_text("".join(json.dumps({"problem": f"q{k % 20}", "answer": "1"}) + "\n" for k in range(40)))
    t = Task(train=str(src), heldout_share=0.25)
    a = t.prepare(tmp_path / "a")
    b = t.prepare(tmp_path / "b")
    assert Path(a[1]).read_text() == Path(b[1]).read_text() and a[2] == ("all",)
    held = {json.loads(x)["problem"] for x in Path(a[1]).read_text().splitlines()}
    train = {json.loads(x)["problem"] for x in Path(a[0]).read_text().splitlines()}
    assert len(held) == 5 and not held & train and len(held | train) == 20  # a duplicate row stays on one side


def test_parse_arm_reads_labels_options_and_the_filtering_remedies():
    assert command.parse_arm("avspo") == ("avspo", Arm("avspo"))
    assert command.parse_arm("opp=avspo:strategy=opposite") == ("opp", Arm("avspo", {"strategy": "opposite"}))
    assert command.parse_arm("dapo-ds") == ("dapo-ds", Arm("grpo", dynamic=True))
    assert command.parse_arm("greso:p_easy=0.3")[1].greso == {"p_easy": 0.3}
    assert command.parse_arm("coin-reward")[1].reward == "random"


def _study(seeds: int) -> GPURemediesStudy:
    return GPURemediesStudy(
        levels=("all",),
        train_prompts=8,
        heldout_per_level=4,
        settings=StudySettings(),
        arms={"A": Arm("grpo"), "B": Arm("avspo"), "C": Arm("sign")},
        seeds={"A": seeds, "B": seeds, "C": seeds},
        primary=("A", "B", "C"),
        base="A",
        second_base="A",
    )


def test_no_verdict_from_too_few_seeds_or_from_a_remedy_that_never_acted():
    # the fewest seeds: 2 / 2^n, the exact sign-flip's smallest p, below Holm's first level alpha / m
    for m in range(1, 8):
        n = fewest_seeds(m)
        assert 2.0 ** (1 - n) < 0.05 / m <= 2.0 ** (2 - n)
    strong = [0.1 + 0.01 * k for k in range(8)]
    for seeds, acted_b, want_b in [
        (2, True, "no verdict: too few seeds (2; "),
        (8, True, "better than A"),
        (8, False, "no verdict: the remedy never acted"),
    ]:
        s = _study(seeds)
        summary = {
            "A": {"seed_list": list(range(seeds))},
            "B": {"seed_list": list(range(seeds)), "vs_A": {"per_seed": strong[:seeds]}, "acted_vs_A": acted_b},
            "C": {"seed_list": list(range(seeds)), "vs_A": {"per_seed": [0.0] * seeds}, "acted_vs_A": True},
        }
        v = s.decide(summary)["verdicts"]
        assert v["B"].startswith(want_b), v
        if seeds == 8:  # it acted, and every seed's score equals the base's
            assert v["C"].startswith("no verdict: every seed's held-out accuracy equals A's"), v


def test_a_remedy_acted_when_some_step_of_some_seed_differs():
    def run(method, seed, curve):
        return {"method": method, "seed": seed, "curve": [dict(zip(("tokens", "reward"), c)) for c in curve]}

    same = [run("A", 0, [(10, 0.0), (20, 0.1)]), run("B", 0, [(10, 0.0), (20, 0.1)])]
    assert acted(same, "B", "A") is False
    assert acted([*same, run("A", 1, [(10, 0.0)]), run("B", 1, [(10, 0.5)])], "B", "A") is True
    assert acted(same, "B", "C") is None


def test_a_sigkill_is_named_as_the_likely_out_of_memory_kill_and_progress_counts_down():
    from avspo_openrlhf.study.scheduler import Progress, exit_words

    assert "out-of-memory killer" in exit_words(-9) and "out-of-memory killer" in exit_words(137)
    assert exit_words(1) == "exit 1" and exit_words(-15) == "exit -15: killed by signal 15"
    p = Progress(5)
    assert re.fullmatch(r"1/5 runs ended, about [\d.]+ min left", p.line())
    assert p.line(4) == "5/5 runs ended"  # a stacked batch's runs end together: counted at once


def test_a_failed_runs_own_error_reaches_the_console(tmp_path):
    import time

    from avspo_openrlhf.study.loop import note_failure
    from avspo_openrlhf.study.scheduler import Job, failure_reason

    job = Job(spec=None, run_dir=tmp_path)
    launched = time.time() - 1
    assert "out-of-memory" in failure_reason(job, -9, launched)  # nothing of its own: the process's exit
    note_failure(tmp_path, "Traceback ...\nValueError: --reward my.py:f returned nan")
    assert failure_reason(job, 1, launched) == "ValueError: --reward my.py:f returned nan"
    assert "out-of-memory" in failure_reason(job, -9, time.time() + 5)  # an error of an earlier launch: not this one
