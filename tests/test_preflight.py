"""avspo-train checks its inputs in seconds, before Ray starts: one clear line, exit 2."""

from __future__ import annotations

import json
import time

import pytest
from helpers import FIXTURES

from avspo_openrlhf.cli.preflight import PreflightError, check_model, check_rows
from avspo_openrlhf.cli.train import main


def _flags(tmp_path, data, model=None, reward=None):
    model_dir = tmp_path / "model"
    model_dir.mkdir(exist_ok=True)
    (model_dir / "config.json").write_text("{}")
    return ["--actor.model_name_or_path", str(model or model_dir), "--actor.num_gpus_per_node", "1",
            "--rollout.n_samples_per_prompt", "8", "--rollout.batch_size", "4", "--rollout.micro_batch_size", "4",
            "--algo.advantage.estimator", "group_norm", "--data.prompt_dataset", str(data),
            "--data.input_key", "prompt", "--data.label_key", "answer",
            "--reward.remote_url", str(reward or FIXTURES / "hash_reward.py"), "--ckpt.path", str(tmp_path / "ckpt")]  # fmt: skip


def _rows(tmp_path, lines, name="prompts.jsonl"):
    path = tmp_path / name
    path.write_text("".join(line + "\n" for line in lines))
    return path


GOOD = [json.dumps({"prompt": f"What is {i} + 1?", "answer": str(i + 1)}) for i in range(5)]


def _fails(capsys, argv) -> str:
    t0 = time.monotonic()
    with pytest.raises(SystemExit) as e:
        main(argv)
    assert e.value.code == 2 and time.monotonic() - t0 < 60  # before any actor starts
    err = capsys.readouterr().err.strip().splitlines()
    assert err and err[-1].startswith("avspo-train: error: ")
    return err[-1]


def test_truncated_line_is_named_by_file_and_line_before_ray(tmp_path, capsys):
    data = _rows(tmp_path, [*GOOD[:3], GOOD[3][:36], GOOD[4], "{broken"])
    msg = _fails(capsys, _flags(tmp_path, data))
    assert f"2 bad row(s) of 6: {data}:4: broken JSON" in msg and f"{data}:6:" in msg


def test_missing_key_missing_file_model_and_reward(tmp_path, capsys):
    data = _rows(tmp_path, [GOOD[0], json.dumps({"question": "x", "answer": "1"})])
    assert "no field 'prompt'" in _fails(capsys, _flags(tmp_path, data))
    null_label = json.dumps({**json.loads(GOOD[0]), "answer": None})
    data = _rows(tmp_path, [GOOD[0], null_label], "null.jsonl")  # it used to reach Ray and the reward as None
    assert f"{data}:2: field 'answer' is empty" in _fails(capsys, _flags(tmp_path, data))
    good = _rows(tmp_path, GOOD, "good.jsonl")
    assert "no such file" in _fails(capsys, _flags(tmp_path, tmp_path / "nope.jsonl"))
    assert "no such folder" in _fails(capsys, _flags(tmp_path, good, model=tmp_path / "no" / "model"))
    bad_reward = tmp_path / "r.py"
    bad_reward.write_text("def not_reward(): pass\n")
    assert "defines no reward_func" in _fails(capsys, _flags(tmp_path, good, reward=bad_reward))
    bad_reward.write_text("import no_such_module_xyz\n")
    assert "import failed: ModuleNotFoundError" in _fails(capsys, _flags(tmp_path, good, reward=bad_reward))
    bad_reward.write_text("def reward_func(queries, prompts, labels):\n    return [0.0]\n")
    assert "must return a dict with 'rewards'" in _fails(capsys, _flags(tmp_path, good, reward=bad_reward))


def test_check_helpers(tmp_path):
    good = _rows(tmp_path, GOOD)
    assert check_rows(str(good), ["prompt", "answer"])["answer"] == "1"
    with pytest.raises(PreflightError, match="no rows"):
        check_rows(str(_rows(tmp_path, [], "empty.jsonl")), ["prompt"])
    check_model("Qwen/Qwen2.5-Math-1.5B")  # a hub id: left to OpenRLHF
    check_model("gpt2")
    with pytest.raises(PreflightError, match="no config.json"):
        check_model(str(tmp_path))


@pytest.mark.parametrize(
    ("config", "limit"),
    [
        ({"max_position_embeddings": 512}, 512),
        ({"n_positions": 1024}, 1024),  # gpt2's name
        ({"text_config": {"max_position_embeddings": 256}}, 256),  # a multimodal config's language model
        ({"max_position_embeddings": 512, "rope_scaling": {"type": "linear", "factor": 4}}, None),  # vLLM decides
        ({}, None),
    ],
)
def test_a_max_len_beyond_the_models_positions_fails_before_ray(tmp_path, capsys, config, limit):
    """vLLM refused it only once Ray and the engine had started, as a pydantic traceback."""
    from avspo_openrlhf.cli.preflight import model_max_positions

    args = _flags(tmp_path, _rows(tmp_path, GOOD))
    (tmp_path / "model" / "config.json").write_text(json.dumps(config))
    assert model_max_positions(str(tmp_path / "model")) == limit
    if limit is None:
        return
    msg = _fails(capsys, [*args, "--data.max_len", str(limit + 1)])
    assert (
        msg.removeprefix("avspo-train: error: ").startswith(f"--data.max_len {limit + 1} ")
        and f"set --data.max_len {limit} or less" in msg
    ), msg


def test_a_ray_address_where_nothing_answers_fails_in_one_line(tmp_path, capsys, monkeypatch):
    """RAY_ADDRESS left over from another shell: the CPU backend's ray.init retried it for minutes."""
    import socket

    from avspo_openrlhf.cli.preflight import check_ray_address

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        free = s.getsockname()[1]  # closed again: nothing listens there
    monkeypatch.setenv("RAY_ADDRESS", f"127.0.0.1:{free}")
    msg = _fails(capsys, ["--backend", "cpu", *_flags(tmp_path, _rows(tmp_path, GOOD))])
    assert f"RAY_ADDRESS=127.0.0.1:{free}: no Ray cluster answers there" in msg
    for fine in (None, "auto", "ray://head:10001"):  # left to Ray
        check_ray_address(fine)


def test_datasets_in_other_forms_are_checked_before_ray(tmp_path, capsys, monkeypatch):
    """A folder, a .csv, a .parquet and a hub id used to fail only after Ray, vLLM and DeepSpeed
    had started; OpenRLHF loads all of them, so they are checked here the way it will read them."""
    empty = tmp_path / "empty_dir"
    empty.mkdir()
    assert "a folder with no dataset in it" in _fails(capsys, _flags(tmp_path, empty))
    csv = tmp_path / "rows.csv"
    csv.write_text("question,answer\nWhat is 1+1?,2\n")
    assert "rows.csv: no column 'prompt' (columns: question, answer)" in _fails(capsys, _flags(tmp_path, csv))
    csv.write_text('prompt,answer\n"What is 1+1?",2\n"What is 2+2?",4,extra\n')
    assert "rows.csv:3: 3 fields, the header has 2" in _fails(capsys, _flags(tmp_path, csv))
    import pyarrow as pa
    import pyarrow.parquet as pq

    pq.write_table(pa.table({"question": ["x"], "answer": ["1"]}), tmp_path / "rows.parquet")
    assert "rows.parquet: no column 'prompt'" in _fails(capsys, _flags(tmp_path, tmp_path / "rows.parquet"))
    folder = tmp_path / "with_rows"
    folder.mkdir()
    (folder / "part.jsonl").write_text(GOOD[0] + "\n{broken\n")
    assert f"{folder / 'part.jsonl'}:2: broken JSON" in _fails(capsys, _flags(tmp_path, folder))
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    assert "the hub is offline (HF_HUB_OFFLINE) with no cached copy of this dataset id" in _fails(
        capsys, _flags(tmp_path, "someorg/no-such-dataset-xyz")
    )


@pytest.mark.slow
def test_labels_math_verify_cannot_parse_are_reported(tmp_path, capsys):
    from avspo_openrlhf.cli.preflight import check_labels

    rows = [json.dumps({"prompt": "q", "answer": a}) for a in ["2", "\\frac{1}{2}", "", "\\"]]
    msg = check_labels(str(_rows(tmp_path, rows)), "answer")
    assert msg.startswith("[avspo] warning: 2 of 4 labels math-verify cannot parse") and "prompts.jsonl:3: ''" in msg
    assert check_labels(str(_rows(tmp_path, rows[:2], "ok.jsonl")), "answer") is None
    bad = _rows(tmp_path, [json.dumps({"prompt": "q", "answer": ""})] * 3, "bad.jsonl")
    with pytest.raises(PreflightError, match="none of the 3 labels .* can be parsed"):
        check_labels(str(bad), "answer")
    # through avspo-train with the math reward: every label unparsable is one line before Ray
    from avspo_openrlhf.rewards import openrlhf_reward

    # (empty labels are refused earlier, by the row check: non-empty ones math-verify cannot read here)
    bad = _rows(tmp_path, [json.dumps({"prompt": "q", "answer": "\\"})] * 3, "bad2.jsonl")
    assert "none of the 3 labels" in _fails(capsys, _flags(tmp_path, bad, reward=openrlhf_reward.__file__))


@pytest.mark.slow
def test_dry_run_runs_the_offline_checks(tmp_path, capsys, monkeypatch):
    """--dry-run (submit.sh's check) catches what a run would catch before Ray: a missing dataset,
    a bad row; a path only the compute nodes see passes with AVSPO_ALLOW_MISSING_PATHS=1, as a
    warning. It changes nothing and needs no Ray: a dead RAY_ADDRESS is not its business."""
    monkeypatch.delenv("AVSPO_ALLOW_MISSING_PATHS", raising=False)
    missing = tmp_path / "nope.jsonl"
    msg = _fails(capsys, ["--dry-run", *_flags(tmp_path, missing)])
    assert (
        msg
        == f"avspo-train: error: {missing}: no such file (a path only the compute nodes see: AVSPO_ALLOW_MISSING_PATHS=1)"
    )
    bad = _rows(tmp_path, [GOOD[0], "{broken"])
    assert f"{bad}:2: broken JSON" in _fails(capsys, ["--dry-run", *_flags(tmp_path, bad)])
    monkeypatch.setenv("AVSPO_ALLOW_MISSING_PATHS", "1")
    assert f"{bad}:2" in _fails(capsys, ["--dry-run", *_flags(tmp_path, bad)])  # only a missing path is allowed
    monkeypatch.setenv("RAY_ADDRESS", "127.0.0.1:9")  # nothing answers there
    assert main(["--dry-run", *_flags(tmp_path, missing, model=tmp_path / "no" / "model"), "--backend", "cpu"]) == 0
    out = capsys.readouterr()
    warnings = [ln for ln in out.err.splitlines() if ln.startswith("[avspo] warning:")]
    assert len(warnings) == 2 and str(missing) in warnings[0] and "no such folder" in warnings[1]
    assert json.loads(out.out[out.out.index("{") :])["data"]["prompt_dataset"] == str(missing)
