"""Math verification: statuses, equivalent forms, adversarial inputs under a hard timeout, the
OpenRLHF reward file called the way OpenRLHF calls it, and the reference audit on MATH-500."""

import asyncio
import importlib.util
import json
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import pytest
import torch
from helpers import shared_file

from avspo_openrlhf.cli.reward_audit import audit_references
from avspo_openrlhf.rewards import (
    STATUSES,
    VerifierPool,
    extract_answer,
    last_boxed,
    response_from_query,
    verify_answer,
)
from avspo_openrlhf.rewards.extract import final_boxes

TIMEOUT = 2.0


@pytest.fixture(scope="module")
def pool():
    with VerifierPool(2, timeout_s=TIMEOUT) as p:
        yield p


# ── extraction ──


@pytest.mark.parametrize(
    "text, expected",
    [
        ("so \\boxed{\\frac{1}{2}} done", ("\\frac{1}{2}", "boxed")),
        ("\\boxed{1} then \\boxed{\\{1, \\{2\\}\\}}", ("\\{1, \\{2\\}\\}", "boxed")),
        ("nested \\boxed{a_{b_{c}}}", ("a_{b_{c}}", "boxed")),
        ("\\fbox{7}", ("7", "boxed")),
        ("\\boxed 42 .", ("42", "boxed")),
        ("\\boxed{5} and a truncated \\boxed{\\frac{1}{", ("5", "boxed")),  # last balanced one
        ("\\boxed{} The answer is 12.", ("12", "phrase")),  # empty box skipped
        ("Final answer: $3\\sqrt{2}$", ("3\\sqrt{2}", "phrase")),
        ("blah\n#### 1,234", ("1234", "hash")),
        ("no answer here", (None, "none")),
        ("", (None, "none")),
    ],
)
def test_extract_answer(text, expected):
    assert extract_answer(text) == expected


def test_response_from_query_drops_the_prompt_and_special_tokens():
    prompt = "<|im_start|>system\nput your final answer within \\boxed{}.<|im_end|>\n<|im_start|>assistant\n"
    assert response_from_query(prompt + "It is 4.<|im_end|><|endoftext|>", prompt) == "It is 4."
    # decoding changed the prompt's start: cut after its tail instead
    assert response_from_query(" " + prompt.lstrip("<") + "x \\boxed{2}", prompt) == "x \\boxed{2}"
    assert last_boxed(response_from_query(prompt + "no box", prompt)) is None


# ── verification ──

EQUIVALENT = [
    ("\\boxed{\\frac{1}{2}}", "1/2"),
    ("\\boxed{0.5}", "\\frac12"),
    ("\\boxed{\\dfrac{3}{4}}", "0.75"),
    ("\\boxed{[1, 2)}", "[1,2)"),
    ("\\boxed{(-\\infty, 3]}", "(-\\infty,3]"),
    ("\\boxed{\\{2, 1\\}}", "\\{1,2\\}"),
    ("\\boxed{10\\text{ cm}}", "10"),
    ("\\boxed{90^\\circ}", "90"),
    ("\\boxed{\\sqrt{12}}", "2\\sqrt{3}"),
    ("The answer is 2\\sqrt{3}.", "2\\sqrt{3}"),
    ("\\boxed{x=5}", "5"),
    ("\\boxed{\\left( 3, \\frac{\\pi}{2} \\right)}", "\\left( 3, \\frac{\\pi}{2} \\right)"),
]


@pytest.mark.parametrize("completion, gold", EQUIVALENT)
def test_equivalent_forms_are_correct(completion, gold):
    assert verify_answer(completion, gold).status == "correct"


@pytest.mark.parametrize(
    "completion, gold, status",
    [
        ("\\boxed{3}", "4", "wrong"),
        ("\\boxed{\\frac{1}{3}}", "0.33", "wrong"),
        ("I give up", "4", "no_answer"),
        ("\\boxed{" + "x" * 2000 + "}", "4", "unparsable"),
        ("\\boxed{4}", "", "error"),
    ],
)
def test_statuses(completion, gold, status):
    r = verify_answer(completion, gold)
    assert r.status == status and r.reward == float(status == "correct")


# ── several boxed answers: one answer, verified as a whole ──

MULTI_CORRECT = [
    # the examples (math-verify on the full text says correct for each)
    ("\\boxed{(2, 2)} \\quad \\text{and} \\quad \\boxed{(6, 2)}", "(2, 2), (6, 2)"),
    ("So x = \\boxed{1}, \\boxed{2}, \\boxed{3}", "1, 2, 3"),
    ("\\boxed{k = 45} and \\boxed{n = 2}", "k = 45, n = 2"),
    # order swapped (the gold is a set of values)
    ("\\boxed{(6, 2)} and \\boxed{(2, 2)}", "(2, 2), (6, 2)"),
    ("\\boxed{3}, \\boxed{1}, \\boxed{2}", "1, 2, 3"),
    ("\\boxed{n = 2} and \\boxed{k = 45}", "k = 45, n = 2"),
    # MATH style: roots listed in math mode, a set gold
    ("The roots are $x = \\boxed{-2}$ and $x = \\boxed{3}$.", "3, -2"),
    ("\\(\\boxed{1}\\), \\(\\boxed{2}\\)", "\\{1, 2\\}"),
    # OlympiadBench style: one equation per variable; solutions joined by "or"
    ("Hence $x=\\boxed{1}$, $y=\\boxed{2}$.", "x=1, y=2"),
    ("so $x = \\boxed{3}$ or $x = \\boxed{5}$", "3, 5"),
    # a repeated box counts once; "x = 5" beside "5" is one value
    ("\\boxed{5} \\boxed{5}", "5"),
    ("Thus $\\boxed{x=5}$, i.e. $\\boxed{5}$", "5"),
    # an intermediate result far earlier does not join the final answer
    ("First, $a = \\boxed{2}$ from the first equation.\n\nTherefore the answer is \\boxed{5}.", "5"),
    ("We get \\boxed{2}. Hence the answer is \\boxed{5}.", "5"),
]

MULTI_WRONG = [
    # hedging: alternatives are verified together, so they never match one gold value
    ("\\boxed{3} or \\boxed{5} or \\boxed{7}", "5"),
    ("\\boxed{5} or \\boxed{3}", "5"),
    ("either $\\boxed{3}$ or $\\boxed{5}$", "5"),
    ("\\boxed{5}, \\boxed{7}", "5"),
    # a partial list is not the answer
    ("\\boxed{(2, 2)} and \\boxed{(6, 2)}", "(2, 2), (6, 2), (1, 1)"),
    # the intermediate box does not complete the final one
    ("First, $a = \\boxed{2}$ from the first equation.\n\nTherefore the answer is \\boxed{5}.", "2, 5"),
]


@pytest.mark.parametrize("completion, gold", MULTI_CORRECT)
def test_several_final_boxes_are_one_answer(completion, gold):
    assert verify_answer(completion, gold).status == "correct"


@pytest.mark.parametrize("completion, gold", MULTI_WRONG)
def test_hedged_partial_and_intermediate_boxes_are_wrong(completion, gold):
    r = verify_answer(completion, gold)
    assert r.status == "wrong", r


def test_final_boxes_rule():
    assert final_boxes("\\boxed{1}, \\boxed{2} \\text{ and } \\boxed{3}") == ["1", "2", "3"]
    assert final_boxes("\\boxed{1}\n\n\\boxed{2}") == ["2"]  # a blank line ends the final answer
    assert final_boxes("\\boxed{1}" + ", " * 40 + "\\boxed{2}") == ["2"]  # too far apart
    assert final_boxes("\\boxed{x=1} and \\boxed{y=1}") == ["x=1", "y=1"]  # same value, other variables
    assert final_boxes("\\boxed{x=1} and \\boxed{1}") == ["x=1"]
    assert final_boxes("no boxes") == [] and final_boxes("\\boxed{}") == []
    # the last-box rule is still there on request (the audit counts what the new rule changes)
    assert verify_answer("\\boxed{3} or \\boxed{5}", "5", multi_box=False).status == "correct"
    assert extract_answer("\\boxed{1}, \\boxed{2}") == ("1, 2", "boxed_multi")


def test_pool_scores_in_order_and_statuses_are_known(pool):
    results = pool.score(["\\boxed{2}", "nothing", "\\boxed{3}"], ["2", "2", "4"])
    assert [r.status for r in results] == ["correct", "no_answer", "wrong"]
    with pytest.raises(ValueError, match="2 completions but 1"):
        pool.score(["a", "b"], ["1"])


ADVERSARIAL = [
    "\\boxed{" + "{" * 5000 + "1" + "}" * 5000 + "}",  # deeply nested braces
    "\\boxed{9^{9^{9^{9}}}}",  # sympy would try to evaluate a tower
    "x" * 1_000_000 + " \\boxed{1}",  # 1 MB completion
    "\\boxed{" + "1+" * 300_000 + "1}",  # 1 MB answer
    "\\boxed{\\left( 1, 2}",  # unbalanced \left(
    "\\boxed{∀x∈ℝ: x² ≥ 0 ✓ 答案}",  # unicode
    "\\boxed{\\frac{\\frac{\\frac{1}{2}}{3}}{\\sqrt{\\sqrt{\\sqrt{\\sqrt{2}}}}}}",
    "",  # empty
    "\\boxed{" * 10_000,  # unbalanced opener storm
]


@pytest.mark.slow
def test_adversarial_inputs_finish_with_a_status_within_the_timeout(pool):
    t0 = time.monotonic()
    futures = [pool.submit(c, "1") for c in ADVERSARIAL]
    for f in futures:
        r = f.result(timeout=2 * TIMEOUT * len(ADVERSARIAL) + 30)  # never a hang
        assert r.status in STATUSES
    # two workers, each sample bounded by two attempts of TIMEOUT (+ starting their replacements)
    assert time.monotonic() - t0 < 2 * TIMEOUT * len(ADVERSARIAL) / 2 + 15


@pytest.mark.slow
def test_hung_worker_is_killed_and_replaced(pool):
    before = pool.counters()
    hung = pool.submit("\\boxed{9^{9^{9^{9}}}}", "1")
    after = [pool.submit("\\boxed{2}", "2") for _ in range(6)]
    r = hung.result(timeout=60)
    assert r.status == "timeout" and r.retries == 1 and "twice" in r.detail  # final after one retry
    assert [f.result(timeout=60).status for f in after] == ["correct"] * 6
    now = pool.counters()
    assert now["timeouts"] == before["timeouts"] + 1 and now["retries"] == before["retries"] + 1
    assert now["restarts"] >= before["restarts"] + 2  # one per overrun


# ── the timing rule: a sample is charged its own verification only ──

SLOW_MODULE = """
import os, time
from avspo_openrlhf.rewards.verify import VERIFIERS, VerifyResult

if os.getpid() != {parent}:
    time.sleep({start_delay})  # a slow worker start (imports under load)


def spin(seconds):  # computes for that much CPU time, like a verification
    end = time.process_time() + seconds
    while time.process_time() < end:
        pass


def slow(completion, gold, *caps):
    kind, _, arg = completion.partition(":")
    if kind == "once":  # slow on the first attempt only (a load spike)
        if not os.path.exists(arg):
            open(arg, "w").close()
            spin(60)
    elif kind == "spin":
        spin(float(arg))
    else:
        time.sleep(float(arg))  # waits without computing
    return VerifyResult("correct", completion)


def loaded(completion, gold, *caps):
    import sys

    return VerifyResult("correct", detail=",".join(sorted(sys.modules)))


VERIFIERS["slow"] = slow
VERIFIERS["modules"] = loaded
"""


def _slow_module(tmp_path, monkeypatch, name, start_delay=0.0):
    import os

    (tmp_path / f"{name}.py").write_text(SLOW_MODULE.format(parent=os.getpid(), start_delay=start_delay))
    monkeypatch.syspath_prepend(str(tmp_path))  # the workers get the caller's sys.path
    return name


@pytest.mark.slow
def test_a_genuinely_slow_verification_times_out_after_one_retry(tmp_path, monkeypatch):
    module = _slow_module(tmp_path, monkeypatch, "slow_verifier_a")
    with VerifierPool(2, timeout_s=1.0, imports=[module]) as p:
        t0 = time.monotonic()
        slow, fast = p.submit("spin:30", "x", "slow"), p.submit("spin:0.1", "x", "slow")
        assert fast.result(timeout=30).status == "correct"
        r = slow.result(timeout=60)
        took = time.monotonic() - t0
        assert r.status == "timeout" and r.retries == 1 and "twice" in r.detail
        assert took >= 2.0  # two attempts, each given its full second
        assert p.counters()["timeouts"] == 1 and p.counters()["retries"] == 1
        # a verification slow only once (a load spike) is saved by the retry
        once = p.submit(f"once:{tmp_path / 'marker'}", "x", "slow").result(timeout=60)
        assert once.status == "correct" and once.retries == 1
        assert p.counters()["timeouts"] == 1 and p.counters()["retries"] == 2
        # a worker holds the verifier, not the caller's program (this pytest process has torch)
        loaded = p.submit("", "x", "modules").result(timeout=60).detail.split(",")
        assert "math_verify" in loaded and "torch" not in loaded and "pytest" not in loaded


@pytest.mark.slow
def test_time_not_spent_computing_is_not_charged_up_to_the_wall_clock_ceiling(tmp_path, monkeypatch):
    """A worker waiting for a core (here: sleeping) for longer than the timeout is not timed out:
    the timeout counts its CPU time. The wall-clock ceiling still ends an attempt that never
    computes."""
    from avspo_openrlhf.rewards.pool import _cpu_seconds

    if _cpu_seconds(1) is None:
        pytest.skip("no /proc: the pool's limit is wall-clock time here")
    module = _slow_module(tmp_path, monkeypatch, "slow_verifier_c")
    with VerifierPool(1, timeout_s=0.5, wall_timeout_s=3.0, imports=[module]) as p:
        r = p.submit("sleep:1.5", "x", "slow").result(timeout=60)  # 3 x the timeout, no CPU
        assert r.status == "correct" and r.retries == 0
        t0 = time.monotonic()
        r = p.submit("sleep:30", "x", "slow").result(timeout=60)
        assert r.status == "timeout" and r.retries == 1 and time.monotonic() - t0 >= 6.0
    assert p.counters()["timeouts"] == 1


@pytest.mark.slow
def test_start_up_and_queueing_are_not_charged_to_a_sample(tmp_path, monkeypatch):
    """Workers that take 3 s to start, one worker, a 1 s timeout, and samples of 0.4 s each queued
    together (2 s of work in all): every one finishes, nothing times out or is retried."""
    module = _slow_module(tmp_path, monkeypatch, "slow_verifier_b", start_delay=3.0)
    with VerifierPool(1, timeout_s=1.0, wall_timeout_s=1.0, imports=[module]) as p:
        t0 = time.monotonic()
        results = p.score(["sleep:0.4"] * 5, ["x"] * 5, "slow")
        assert time.monotonic() - t0 >= 3.0 + 5 * 0.4
    assert [r.status for r in results] == ["correct"] * 5 and [r.retries for r in results] == [0] * 5
    assert p.counters() == {"timeouts": 0, "retries": 0, "restarts": 0}


def test_workers_do_not_import_the_callers_main_module(tmp_path):
    """multiprocessing's workers re-ran the caller's ``__main__`` (for avspo-eval: torch and the
    trainer) on every start; the pool's workers import the verifier only."""
    import subprocess
    import sys

    marker = tmp_path / "imported"
    script = tmp_path / "caller.py"
    script.write_text(
        "import sys\n"
        f"if __name__ != '__main__':\n    open({str(marker)!r}, 'a').write(__name__ + '\\n')\n"
        "from avspo_openrlhf.rewards import VerifierPool\n"
        "if __name__ == '__main__':\n"
        "    with VerifierPool(2, timeout_s=5) as p:\n"
        "        print([r.status for r in p.score(['\\\\boxed{2}'] * 4, ['2'] * 4)])\n"
    )
    r = subprocess.run([sys.executable, str(script)], capture_output=True, text=True, timeout=120)
    assert r.returncode == 0, r.stderr[-2000:]
    assert r.stdout.strip() == str(["correct"] * 4)
    assert not marker.exists(), marker.read_text()


def test_pool_arguments_are_checked(pool, monkeypatch):
    from avspo_openrlhf.rewards.verify import VERIFIERS

    monkeypatch.setitem(VERIFIERS, "parent_only", VERIFIERS["project"])  # not in the workers
    r = pool.submit("\\boxed{1}", "1", "parent_only").result(timeout=60)
    assert r.status == "error" and "VerifierPool(imports=...)" in r.detail
    with pytest.raises(ValueError, match="timeout_s"):
        VerifierPool(1, timeout_s=0)
    with pytest.raises(ValueError, match="wall_timeout_s >= timeout_s"):
        VerifierPool(1, timeout_s=2, wall_timeout_s=1)
    with pytest.raises(ValueError, match="num_workers"):
        VerifierPool(0)
    with pytest.raises(ModuleNotFoundError):
        VerifierPool(1, imports=["no_such_verifier_module"])


# ── the OpenRLHF reward file ──

REWARD_FILE = Path(__file__).resolve().parents[1] / "avspo_openrlhf" / "rewards" / "openrlhf_reward.py"


def load_reward_func():
    # exactly how OpenRLHF's SingleTurnAgentExecutor loads --reward.remote_url *.py
    spec = importlib.util.spec_from_file_location("reward_func", str(REWARD_FILE))
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module.reward_func


def test_reward_file_from_threads_and_asyncio(monkeypatch):
    monkeypatch.setenv("AVSPO_REWARD_WORKERS", "2")
    reward_func = load_reward_func()
    prompt = "<|im_start|>user\nWhat is 2+2? Put it in \\boxed{}.<|im_end|>\n<|im_start|>assistant\n"
    cases = [(prompt + "\\boxed{4}<|im_end|>", 1.0), (prompt + "\\boxed{5}<|im_end|>", 0.0), (prompt + "hmm", 0.0)] * 8

    def call(case):
        return reward_func([case[0]], [prompt], ["4"])

    with ThreadPoolExecutor(8) as ex:
        outs = list(ex.map(call, cases))
    for (_, expected), out in zip(cases, outs):
        assert out["rewards"].tolist() == [expected] and out["scores"].tolist() == [expected]
        assert sum(out["extra_logs"][f"verify/{s}"].item() for s in STATUSES) == 1.0  # one status per sample
        assert out["extra_logs"]["verify/retried"].item() == 0.0  # nothing overran the timeout
        # what OpenRLHF's samples generator does with them
        assert torch.tensor([out["rewards"]]).item() == expected
    assert outs[2]["extra_logs"]["verify/no_answer"].item() == 1.0

    async def openrlhf_style():
        return await asyncio.gather(*[asyncio.to_thread(reward_func, [c], [prompt], ["4"]) for c, _ in cases[:6]])

    assert [o["rewards"].item() for o in asyncio.run(openrlhf_style())] == [1.0, 0.0, 0.0] * 2


# ── reference audit on MATH-500 ──


@pytest.mark.slow
def test_math500_references_audit(pool):
    rows = [json.loads(line) for line in open(shared_file("math500.jsonl"))]
    report, fn, fp = audit_references(rows, pool)
    assert report["n"] == 500
    assert 1 - report["false_negative_rate"] >= 0.995, fn[:3]
    assert report["false_positive_rate"] <= 0.005, fp[:3]
    assert report["status_own"]["timeout"] == 0


def test_labelled_completions_audit(pool, tmp_path):
    from avspo_openrlhf.cli.reward_audit import audit_labelled, main

    rows = [
        {"completion": "\\boxed{4}", "answer": "4", "label": True},  # agreed correct
        {"completion": "so it is 4, I think", "answer": "4", "label": True},  # verifier misses: false negative
        {"completion": "\\boxed{5}", "answer": "4", "label": False},  # agreed wrong
        {"completion": "\\boxed{x=4}", "answer": "4", "label": False},  # verifier accepts: false positive vs the label
    ]
    report, fn, fp = audit_labelled(rows, pool)
    assert report["false_negative_rate"] == 0.5 and report["false_positive_rate"] == 0.5
    assert fn[0]["status"] == "no_answer" and fp[0]["completion"] == "\\boxed{x=4}"
    with pytest.raises(ValueError, match="boolean 'label'"):
        audit_labelled([{"completion": "x", "answer": "1", "label": "yes"}], pool)
    path = tmp_path / "labelled.jsonl"
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    assert main(["--completions", str(path), "--out-dir", str(tmp_path / "out"), "--workers", "1"]) == 0
    assert json.loads((tmp_path / "out" / "report.json").read_text())["n"] == 4
    assert len((tmp_path / "out" / "false_negatives.jsonl").read_text().splitlines()) == 1


def test_second_opinion_audit_reports_disagreements_by_category(pool, tmp_path):
    from avspo_openrlhf.cli.reward_audit import audit_second_opinion, disagreement_category, main

    rows = [
        {"completion": "\\boxed{4}", "answer": "4"},  # both correct
        {"completion": "so it is $4$", "answer": "4"},  # no answer marker: math-verify alone reads it
        {"completion": "\\boxed{1}, \\boxed{2}", "answer": "1, 2"},  # several boxes: both correct now
        {"completion": "\\boxed{3} or \\boxed{5}", "answer": "5"},  # hedging: both wrong
        {"completion": "\\boxed{7}", "answer": "8"},  # both wrong
    ]
    report, dis = audit_second_opinion([r["completion"] for r in rows], [r["answer"] for r in rows], pool)
    assert report["n"] == 5 and report["disagree"] == len(dis) == 1
    assert dis[0]["category"] == "no_answer_marker" and dis[0]["who_says_correct"] == "math_verify"
    assert report["by_category"]["no_answer_marker"]["math_verify_only_correct"] == 1
    mb = report["multi_box"]
    assert mb["completions_with_several_final_boxes"] == 2
    # the new rule fixed "1, 2" and stopped rewarding the hedge (the last box alone was 5)
    assert mb["flips_wrong_to_correct_vs_last_box"] == 1 and mb["flips_correct_to_wrong_vs_last_box"] == 1
    assert disagreement_category("\\boxed{\\begin{pmatrix} 1 \\\\ 2 \\end{pmatrix}}", "x") == "matrix"
    assert disagreement_category("\\boxed{x > 2}", "(2, \\infty)") == "relation"
    assert disagreement_category("\\boxed{5\\text{ cm}}", "5") == "units"
    assert disagreement_category("\\boxed{[1, 2)}", "[1,2)") == "interval"

    # CLI: a completions file (no labels needed) and avspo-eval records in a folder
    comp = tmp_path / "comp.jsonl"
    comp.write_text("".join(json.dumps(r) + "\n" for r in rows))
    assert (
        main(["--second-opinion", "--completions", str(comp), "--out-dir", str(tmp_path / "a"), "--workers", "1"]) == 0
    )
    assert json.loads((tmp_path / "a" / "report.json").read_text())["disagree"] == 1
    assert len((tmp_path / "a" / "disagreements.jsonl").read_text().splitlines()) == 1
    rec = tmp_path / "eval" / "math500" / "records.jsonl"
    rec.parent.mkdir(parents=True)
    rec.write_text(json.dumps({"answer": "4", "completions": [r["completion"] for r in rows[:2]]}) + "\n")
    assert main(["--second-opinion", "--records", str(tmp_path / "eval"), "--out-dir", str(tmp_path / "b"),
                 "--workers", "1"]) == 0  # fmt: skip
    assert json.loads((tmp_path / "b" / "report.json").read_text())["n"] == 2
    with pytest.raises(SystemExit):  # --records without --second-opinion
        main(["--records", str(rec)])
