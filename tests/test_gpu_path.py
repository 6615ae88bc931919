"""`avspo-train --backend gpu` on a machine without a GPU: the README's GPU command runs through
OpenRLHF's own ``train(args)`` (openrlhf/cli/train_ppo_ray.py) with only the process boundary
faked: Ray actors are built in this process and their methods called directly, placement groups
are always ready, vLLM engines are stand-ins, the DeepSpeed model groups record what they are
given. Everything between the command line and the trainer actor's ``fit`` is the real code, so the
test fails when our trainer, samples generator, experience maker, strategy or policy actor class
stop reaching OpenRLHF (e.g. a release that imports the trainer at module top)."""

from __future__ import annotations

import asyncio
import inspect
import re
import signal
from pathlib import Path

import pytest
from helpers import FIXTURES

ROOT = Path(__file__).resolve().parents[1]
pytest.importorskip("deepspeed")


class FakeRef:
    def __init__(self, value):
        self.value = value


def _resolve(x):
    if isinstance(x, FakeRef):
        return x.value
    if isinstance(x, list):
        return [_resolve(v) for v in x]
    return x


class _Method:
    def __init__(self, actor, name):
        self.actor, self.name = actor, name

    def remote(self, *args, **kwargs):
        self.actor.calls.append(self.name)
        if self.name in FakeActor.DEFERRED:  # the training loop itself: recorded, not run
            return FakeRef(None)
        out = getattr(self.actor.instance, self.name)(
            *_resolve(list(args)), **{k: _resolve(v) for k, v in kwargs.items()}
        )
        if inspect.iscoroutine(out):
            out = asyncio.new_event_loop().run_until_complete(out)
        return FakeRef(out)

    def options(self, **_):
        return self


class FakeActor:
    """A Ray actor handle whose actor lives in this process."""

    DEFERRED = {"fit"}
    created: list = []

    def __init__(self, cls, args, kwargs):
        self.cls = cls
        self.calls: list[str] = []
        self.instance = cls(*_resolve(list(args or ())), **{k: _resolve(v) for k, v in (kwargs or {}).items()})
        FakeActor.created.append(self)

    def __getattr__(self, name):
        if name.startswith("__"):
            raise AttributeError(name)
        return _Method(self, name)


class FakeGroup:
    """OpenRLHF's ``RayActorGroup`` of DeepSpeed model actors: records the actor class it was given."""

    created: list = []

    def __init__(self, num_nodes, num_gpus_per_node, ray_actor_type, pg=None, num_gpus_per_actor=1, **kwargs):
        self.ray_actor_type, self.size = ray_actor_type, num_nodes * num_gpus_per_node
        self.calls: list[str] = []
        FakeGroup.created.append(self)

    def __getattr__(self, name):
        if name.startswith("__"):
            raise AttributeError(name)

        def call(*args, **kwargs):
            self.calls.append(name)
            return []

        return call


class FakePlacementGroup:
    def ready(self):
        return FakeRef(True)


@pytest.fixture
def fake_process_boundary(monkeypatch):
    import ray
    import torch
    from openrlhf.cli import train_ppo_ray

    from avspo_openrlhf.install import installed

    FakeActor.created, FakeGroup.created = [], []
    engines: list = []
    monkeypatch.setattr(
        ray.actor.ActorClass,
        "_remote",
        lambda self, args=None, kwargs=None, **opts: FakeActor(self.__ray_actor_class__, args, kwargs),
    )
    monkeypatch.setattr(ray, "get", lambda x, timeout=None: _resolve(x))
    monkeypatch.setattr(ray, "put", FakeRef)
    monkeypatch.setattr(ray, "is_initialized", lambda: True)
    # the trainer actor's own process has no torch.distributed group (an earlier test of this pytest
    # process may have made one, which OpenRLHF's dataloader setup would then try to shard over)
    monkeypatch.setattr(torch.distributed, "is_initialized", lambda: False)
    monkeypatch.setattr(train_ppo_ray, "placement_group", lambda bundles, strategy=None: FakePlacementGroup())
    monkeypatch.setattr(train_ppo_ray, "RayActorGroup", FakeGroup)

    def create_vllm_engines(num_engines, *args, **kwargs):
        engines.extend(object() for _ in range(num_engines))
        return list(engines)

    monkeypatch.setattr(train_ppo_ray, "create_vllm_engines", create_vllm_engines)
    handlers = {s: signal.getsignal(s) for s in (signal.SIGINT, signal.SIGTERM)}
    with installed(cpu=True):  # this machine's CUDA-call stand-ins (a GPU machine has CUDA)
        yield engines
    for s, h in handlers.items():
        signal.signal(s, h)


def readme_gpu_command() -> list[str]:
    text = (ROOT / "README.md").read_text(encoding="utf-8").split("<!-- gpu-command -->", 1)[1]
    block = text.split("```bash", 1)[1].split("```", 1)[0]
    block = "\n".join(line for line in block.splitlines() if not line.lstrip().startswith("#"))  # the docs test's note
    words = block.replace("\\\n", " ").split()
    assert words[0] == "avspo-train"
    return words[1:]


def _replace(argv: list[str], flag: str, value: str) -> list[str]:
    i = argv.index(flag)
    return argv[: i + 1] + [value] + argv[i + 2 :]


@pytest.fixture
def gpu_argv(tmp_path):
    from avspo_openrlhf.cpu.tiny import build_tiny_model
    from avspo_openrlhf.data.io import write_jsonl
    from avspo_openrlhf.data.tasks import make_prompt, synthetic_arithmetic

    rows = synthetic_arithmetic(16, ["add1"], seed=0)
    for r in rows:
        r["prompt"] = make_prompt(r["problem"])
    write_jsonl(rows, str(tmp_path / "data.jsonl"))
    argv = readme_gpu_command()
    # the README's command with what this offline machine has: the tiny model, a small dataset, a
    # reward file, paths under tmp_path; every other flag as the README gives it
    argv = _replace(argv, "--actor.model_name_or_path", build_tiny_model(str(tmp_path / "tiny")))
    argv = _replace(argv, "--data.prompt_dataset", str(tmp_path / "data.jsonl"))
    argv = _replace(argv, "--reward.remote_url", str(FIXTURES / "hash_reward.py"))
    for flag in ("--logger.tensorboard_dir", "--ckpt.path", "--ckpt.output_dir"):
        i = argv.index(flag)
        argv[i + 1] = str(tmp_path / argv[i + 1].replace("/", "_"))
    return argv


def _trainer(cls_name: str):
    found = [a for a in FakeActor.created if a.cls.__name__ == cls_name]
    assert len(found) == 1, [a.cls.__name__ for a in FakeActor.created]
    return found[0]


def _check_trainer_parts(trainer_instance, args_expected):
    from avspo_openrlhf.trainer.checkpoint import CrashSafeStrategy
    from avspo_openrlhf.trainer.experience_maker import RemedyExperienceMaker
    from avspo_openrlhf.trainer.samples import RemedySamplesGenerator

    assert type(trainer_instance.experience_maker) is RemedyExperienceMaker
    assert isinstance(trainer_instance.strategy, CrashSafeStrategy)
    a = trainer_instance.strategy.args
    for dotted, value in args_expected.items():
        obj = a
        for part in dotted.split("."):
            obj = getattr(obj, part)
        assert obj == value, dotted
    assert trainer_instance.controller.estimator == "avspo" and trainer_instance.controller.tracker.recent.maxlen == 25
    return RemedySamplesGenerator


EXPECTED = {
    "remedy": "avspo",
    "avspo.strategy": "stratified",
    "acr.window": 25,
    "rollout.n_samples_per_prompt": 8,
    "actor.adam.lr": 1e-6,
    "ckpt.save_steps": 50,
}


@pytest.mark.slow
def test_sync_gpu_command_builds_our_trainer_inside_openrlhfs_train(fake_process_boundary, gpu_argv):
    from avspo_openrlhf.cli.train import run
    from avspo_openrlhf.trainer.actors import RemedyPolicyModelActor

    run(gpu_argv)
    t = _trainer("_PPOTrainer")  # ours: a subclass of OpenRLHF's PPOTrainer actor class
    assert t.calls == ["get_max_steps", "fit"]
    generator_cls = _check_trainer_parts(t.instance, EXPECTED)
    assert type(t.instance.samples_generator) is generator_cls
    assert t.instance.samples_generator.vllm_engines == fake_process_boundary  # the engines train() created
    assert t.instance.strategy.args.train.colocate_all  # the README's colocated layout reached the trainer
    policy = FakeGroup.created[0]
    assert policy.ray_actor_type is RemedyPolicyModelActor and policy.size == 8
    assert "async_init_model_from_pretrained" in policy.calls and "async_save_model" in policy.calls


@pytest.mark.slow
def test_async_gpu_command_builds_our_async_trainer_and_actors(fake_process_boundary, gpu_argv):
    from avspo_openrlhf.cli.train import run
    from avspo_openrlhf.trainer.trainers import AsyncCoordinator, _GenerateSamplesActor, _TrainingActor

    argv = [a for a in gpu_argv if a not in ("--train.colocate_all", "--vllm.enable_sleep", "--ds.enable_sleep")]
    run([*argv, "--train.async_enable"])
    top = _trainer("_PPOTrainerAsync")
    assert top.calls == ["get_max_steps", "fit"]
    training, generator = _trainer("_TrainingActor"), _trainer("_GenerateSamplesActor")
    assert training.cls is _TrainingActor and generator.cls is _GenerateSamplesActor
    assert top.instance.trainer_actor is training and top.instance.generator_actor is generator
    generator_cls = _check_trainer_parts(training.instance, {**EXPECTED, "train.async_enable": True})
    assert type(generator.instance.samples_generator) is generator_cls
    coordinator = _trainer("AsyncCoordinator")
    assert coordinator.cls is AsyncCoordinator and training.instance.coordinator is coordinator


@pytest.mark.slow
def test_the_replacement_is_what_puts_our_trainer_there(fake_process_boundary, gpu_argv, monkeypatch):
    """Without install.py's replacement (as if OpenRLHF imported its trainer at module top) the same
    command builds OpenRLHF's own trainer: the two tests above would fail, and this one says why."""
    from avspo_openrlhf import install
    from avspo_openrlhf.cli.train import run

    real = install._replacements
    monkeypatch.setattr(install, "_replacements", lambda **kw: [p for p in real(**kw) if p.attribute != "PPOTrainer"])
    run(gpu_argv)
    names = [a.cls.__name__ for a in FakeActor.created]
    assert "PPOTrainer" in names and "_PPOTrainer" not in names


def test_train_still_imports_its_trainer_at_call_time():
    """The replacement works only while train() looks the trainer class up when it runs."""
    from openrlhf.cli import train_ppo_ray

    src = inspect.getsource(train_ppo_ray.train)
    assert re.search(r"^\s+from openrlhf\.trainer\.ppo_trainer import PPOTrainer$", src, re.M)
    assert re.search(r"^\s+from openrlhf\.trainer\.ppo_trainer_async import PPOTrainerAsync as PPOTrainer$", src, re.M)
