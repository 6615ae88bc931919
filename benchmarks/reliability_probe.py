"""Bad inputs a user or an operator causes, run through the real ``avspo-train --backend cpu`` (no
``--dry-run``): is each one refused before Ray starts, in one line, within seconds?

    python benchmarks/reliability_probe.py [--only NAME ...] [--json out.json]

Each case starts from a run that works (the tiny model, 32 arithmetic prompts, the arithmetic reward)
and breaks one thing. A case counts as *rejected before Ray in one line* when the process exits
non-zero, printed exactly one ``error`` line, no traceback, and never started Ray; a case that got
as far as Ray is killed after ``--late-s`` seconds and counted as *late*. Prints a table and the
counts; the faults (kill -9 in a checkpoint, two writers, hanging rewards, ...) are reproduced by
tests/test_reliability.py and tests/test_reward_guard.py instead, where they are asserted.
"""

from __future__ import annotations

import argparse
import json
import os
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path

RAY_MARKERS = ("Started a local Ray instance", "joined the Ray cluster", "ray.init", "CPU split:", "(pid=")


def base_flags(assets: dict, out: Path, reward: str) -> list[str]:
    return [
        "--backend", "cpu", "--actor.model_name_or_path", assets["model"],
        "--data.prompt_dataset", assets["data"], "--data.input_key", "prompt", "--data.label_key", "answer",
        "--data.apply_chat_template", "--reward.remote_url", reward,
        "--algo.advantage.estimator", "group_norm", "--rollout.n_samples_per_prompt", "4",
        "--rollout.batch_size", "4", "--rollout.micro_batch_size", "8", "--train.batch_size", "16",
        "--train.micro_batch_size", "8", "--rollout.max_new_tokens", "12", "--data.max_len", "96",
        "--ckpt.path", str(out / "ckpt"), "--run.max_steps", "1",
    ]  # fmt: skip


def replace(flags: list[str], flag: str, value: str | None) -> list[str]:
    """``flags`` with ``flag``'s value replaced (``None``: the flag removed)."""
    out, i = [], 0
    while i < len(flags):
        if flags[i] == flag:
            if value is not None:
                out += [flag, value]
            i += 2
            continue
        out.append(flags[i])
        i += 1
    return out


def cases(tmp: Path, assets: dict, good_reward: str) -> list[tuple[str, callable]]:
    """(name, flags -> flags) for every bad input; files they need are written under ``tmp``."""

    def write(name: str, text: str | bytes) -> str:
        p = tmp / name
        p.parent.mkdir(parents=True, exist_ok=True)
        (p.write_bytes if isinstance(text, bytes) else p.write_text)(text)
        return str(p)

    good_rows = Path(assets["data"]).read_text().splitlines()
    row = good_rows[0]
    rewards = {
        "reward_syntax": "def reward_func(queries, prompts, labels:\n",
        "reward_no_func": "def other(q, p, l):\n    return 0\n",
        "reward_wrong_len": "import torch\ndef reward_func(queries, prompts, labels, **kw):\n    return torch.zeros(1)\n",
        "reward_raises": "def reward_func(queries, prompts, labels, **kw):\n    raise ValueError('boom')\n",
        "reward_hangs": "import time\ndef reward_func(queries, prompts, labels, **kw):\n    time.sleep(3600)\n",
        "reward_nan": "import torch\ndef reward_func(queries, prompts, labels, **kw):\n"
        "    return torch.full((len(queries),), float('nan'))\n",
        "reward_dict_no_rewards": "def reward_func(queries, prompts, labels, **kw):\n    return {'scores': [0] * len(queries)}\n",
        "reward_import_error": "import no_such_module_xyz\ndef reward_func(q, p, l, **kw):\n    return [0] * len(q)\n",
    }
    out: list[tuple[str, callable]] = []
    for name, body in rewards.items():
        path = write(f"{name}.py", body)
        out.append((name, lambda f, p=path: replace(f, "--reward.remote_url", p)))
    data = {
        "data_truncated_line": "\n".join(good_rows[:3] + [row[: len(row) // 2]]) + "\n",
        "data_missing_key": "\n".join(
            json.dumps({k: v for k, v in json.loads(r).items() if k != "answer"}) for r in good_rows[:4]
        )
        + "\n",
        "data_empty": "",
        "data_not_json": "hello\nworld\n",
        "data_null_label": "\n".join(json.dumps({**json.loads(r), "answer": None}) for r in good_rows[:4]) + "\n",
        "data_unparsable_labels": "\n".join(json.dumps({**json.loads(r), "answer": "\\"}) for r in good_rows[:4])
        + "\n",
    }
    for name, text in data.items():
        path = write(f"{name}.jsonl", text)
        out.append((name, lambda f, p=path: replace(f, "--data.prompt_dataset", p)))
    # labels are only "unparsable" for the math reward (a reward file of yours reads them its own way)
    name = "data_unparsable_labels"
    out[-1] = (name, lambda f: replace(replace(f, "--data.prompt_dataset", str(tmp / f"{name}.jsonl")),
                                       "--reward.remote_url", "avspo:math"))  # fmt: skip
    out.append(
        ("data_non_utf8", lambda f: replace(f, "--data.prompt_dataset", write("bad.jsonl", b'{"prompt": "\xff"}\n')))
    )
    out.append(("data_missing_file", lambda f: replace(f, "--data.prompt_dataset", str(tmp / "nope.jsonl"))))
    out.append(
        ("data_directory_empty", lambda f: replace(f, "--data.prompt_dataset", str((tmp / "emptydir").resolve())))
    )
    out.append(("data_csv_missing_column", lambda f: replace(f, "--data.prompt_dataset", write("d.csv", "x,y\n1,2\n"))))
    out.append(("data_hub_id_offline", lambda f: replace(f, "--data.prompt_dataset", "someone/some-dataset-xyz")))
    out.append(("model_missing_relative", lambda f: replace(f, "--actor.model_name_or_path", "models/nope")))
    out.append(("model_missing_absolute", lambda f: replace(f, "--actor.model_name_or_path", str(tmp / "nomodel"))))
    out.append(
        ("model_hub_id_offline", lambda f: replace(f, "--actor.model_name_or_path", "someone/no-such-model-xyz"))
    )
    out.append(("model_folder_without_config", lambda f: replace(f, "--actor.model_name_or_path", str(tmp))))
    out.append(("reward_missing_file", lambda f: replace(f, "--reward.remote_url", str(tmp / "nope.py"))))
    out.append(("reward_unknown_alias", lambda f: replace(f, "--reward.remote_url", "avspo:nope")))
    out.append(("reward_none", lambda f: replace(f, "--reward.remote_url", None)))
    numbers = [
        ("--acr.ema_decay", "2"), ("--acr.ema_decay", "-0.1"), ("--actor.adam.lr", "-1"), ("--actor.adam.lr", "nan"),
        ("--rollout.temperature", "-1"), ("--rollout.max_new_tokens", "0"), ("--train.batch_size", "15"),
        ("--ckpt.max_num", "0"), ("--ckpt.save_steps", "0"), ("--train.async_queue_size", "0"),
        ("--acr.volatility_window", "1"), ("--rollout.n_samples_per_prompt", "1"), ("--acr.tau_init", "1.5"),
        ("--avspo.alpha", "-1"), ("--acr.window", "0"), ("--data.max_len", "8"), ("--rollout.batch_size", "0"),
        ("--run.max_steps", "-3"), ("--run.reward_timeout_s", "0"), ("--actor.eps_clip", "-0.2"),
        ("--cpu.engine_cores", "0-999"), ("--cpu.dtype", "fp8"), ("--buffer.max_staleness", "-1"),
    ]  # fmt: skip
    for flag, value in numbers:
        out.append((f"{flag} {value}", lambda f, a=flag, v=value: [*f, a, v]))
    out += [
        ("flag prefix --acr.tau_i", lambda f: [*f, "--acr.tau_i", "0.3"]),
        ("unknown flag", lambda f: [*f, "--avspo.no_such_flag", "1"]),
        ("async + colocate", lambda f: [*f, "--train.async_enable", "--train.colocate_all"]),
        ("core split overlaps", lambda f: [*f, "--cpu.engine_cores", "0", "--cpu.train_cores", "0"]),
        ("partial rollout on cpu", lambda f: [*f, "--train.async_enable", "--train.partial_rollout_enable"]),
        ("RAY_ADDRESS dead", "env:RAY_ADDRESS=127.0.0.1:1"),
        ("run folder locked", "lock"),
    ]
    return out


def run_case(flags: list[str], env: dict, late_s: float) -> dict:
    cmd = [sys.executable, "-m", "avspo_openrlhf.cli.train", *flags]
    t0 = time.monotonic()
    p = subprocess.Popen(
        cmd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, env=env, start_new_session=True
    )
    try:
        out, _ = p.communicate(timeout=late_s)
    except subprocess.TimeoutExpired:
        os.killpg(p.pid, signal.SIGKILL)
        out, _ = p.communicate()
    took = time.monotonic() - t0
    lines = [ln for ln in out.splitlines() if ln.strip() and "[WARNING]" not in ln and "FutureWarning" not in ln]
    errors = [ln for ln in lines if "error" in ln.lower() and "warnings.warn" not in ln]
    ray = any(m in out for m in RAY_MARKERS)
    one_line = p.returncode not in (0, None, -9) and not ray and "Traceback" not in out and len(errors) == 1
    return {
        "rc": p.returncode,
        "seconds": round(took, 1),
        "ray_started": ray,
        "traceback": "Traceback" in out,
        "error_lines": len(errors),
        "one_line_before_ray": one_line,
        "message": (errors[0] if errors else (lines[-1] if lines else ""))[:200],
    }


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--only", nargs="*", help="case names to run (default: all)")
    ap.add_argument("--late-s", type=float, default=60, help="seconds after which a case counts as late")
    ap.add_argument("--json", help="write every case's result here")
    a = ap.parse_args(argv)
    from avspo_openrlhf.cpu.tiny import tiny_assets
    from avspo_openrlhf.rewards import arith_reward

    tmp = Path(tempfile.mkdtemp(prefix="avspo-probe-"))
    (tmp / "emptydir").mkdir()
    assets = tiny_assets(str(tmp))
    good_reward = arith_reward.__file__
    env = {k: v for k, v in os.environ.items() if not k.startswith("RAY_")}
    env.update(HF_HUB_OFFLINE="1", TRANSFORMERS_OFFLINE="1", HF_DATASETS_OFFLINE="1", PYTHONUNBUFFERED="1")
    results = {}
    todo = [c for c in cases(tmp, assets, good_reward) if not a.only or c[0] in a.only]
    for i, (name, make) in enumerate(todo, 1):
        out = tmp / f"run{i}"
        flags = base_flags(assets, out, good_reward)
        case_env = dict(env)
        if make == "lock":  # another live training holds the run folder (this process, till the end)
            from avspo_openrlhf.folder_lock import lock_folder

            lock_folder(str(out / "ckpt"), "avspo-train")
        elif isinstance(make, str) and make.startswith("env:"):
            k, v = make[4:].split("=", 1)
            case_env[k] = v
        else:
            flags = make(flags)
        results[name] = run_case(flags, case_env, a.late_s)
        r = results[name]
        verdict = (
            "one line, before Ray"
            if r["one_line_before_ray"]
            else ("LATE (Ray started)" if r["ray_started"] else "not one line")
        )
        print(
            f"[{i:2d}/{len(todo)}] {name:32s} rc={r['rc']!s:>4} {r['seconds']:5.1f}s  {verdict}: {r['message']}",
            flush=True,
        )
    n = len(results)
    good = sum(r["one_line_before_ray"] for r in results.values())
    late = [k for k, r in results.items() if r["ray_started"]]
    print(
        f"\nbad inputs tried: {n}; rejected before Ray in one line: {good}; reached Ray: {len(late)} {late}; "
        f"other: {[k for k, r in results.items() if not r['one_line_before_ray'] and not r['ray_started']]}"
    )
    print(f"slowest rejection: {max(r['seconds'] for r in results.values() if r['one_line_before_ray']):.1f} s")
    if a.json:
        Path(a.json).write_text(json.dumps(results, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
