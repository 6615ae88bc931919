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
