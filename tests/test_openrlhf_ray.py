"""OpenRLHF's real SamplesGenerator, agent executor and reward-file path on local Ray with a scripted
engine actor (no vLLM); our flags inside a Ray actor; the async buffer's staleness bound."""

import queue
import threading
import time
from types import SimpleNamespace as NS

import pytest
import torch
from orl import parse, scripted_engine_class

ray = pytest.importorskip("ray")
pytest.importorskip("openrlhf")

from avspo_openrlhf.rewards import openrlhf_reward  # noqa: E402
from avspo_openrlhf.trainer.samples import RemedySamplesGenerator  # noqa: E402
from avspo_openrlhf.trainer.trainers import SKIPPED, AsyncCoordinator, RemedyTrainerMixin  # noqa: E402

REWARD_FILE = openrlhf_reward.__file__


@pytest.fixture(scope="module")
def local_ray(tmp_path_factory):
    from avspo_openrlhf.cpu.tiny import build_tiny_model

    tiny = build_tiny_model(str(tmp_path_factory.mktemp("tiny")))
    if ray.is_initialized():  # an earlier test's implicit init lacks our worker setup hook
        ray.shutdown()
    ray.init(
        address="local",  # never a `ray start` cluster that happens to run on this machine
        num_cpus=2,
        include_dashboard=False,
        log_to_driver=False,
        runtime_env={
            "worker_process_setup_hook": "avspo_openrlhf.cpu.compat.install_gpu_module_stubs",
            "env_vars": {"AVSPO_REWARD_WORKERS": "1", "DS_ACCELERATOR": "cpu", "TOKENIZERS_PARALLELISM": "false"},
        },
    )
    yield tiny
    ray.shutdown()


def _prompts(n):
    return [(f"q{i}", [f"q{i}"], [str(i)], [None]) for i in range(n)]


def _tokenizer(path):
    from transformers import AutoTokenizer

    return AutoTokenizer.from_pretrained(path)


@pytest.mark.slow
def test_our_flags_reach_a_ray_actor(local_ray):
    from openrlhf.utils import get_strategy

    args = parse("--remedy", "avspo", "--avspo.alpha", "0.7", "--acr.window", "3", "--buffer.max_staleness", "2")
    strategy = get_strategy(args)

    @ray.remote(num_cpus=0)
    class Reader:
        def read(self, strategy):
            a = strategy.args
            return a.remedy, a.avspo.alpha, a.acr.window, a.buffer.max_staleness, a.rollout.n_samples_per_prompt

    assert ray.get(Reader.remote().read.remote(strategy)) == ("avspo", 0.7, 3, 2, 8)


SCRIPT = {
    "q0": ["so \\boxed{0}"],  # always right -> all-right group
    "q1": ["so \\boxed{5}"],  # always wrong -> all-wrong group
    "q2": ["\\boxed{2}", "\\boxed{3}"],  # mixed
    "q3": ["no answer here", "\\boxed{3}"],  # mixed, one no_answer
    "q4": ["\\boxed{4}", "\\boxed{0}"],
    "q5": ["\\boxed{5}", "\\boxed{1}"],
}


@pytest.mark.slow
@pytest.mark.parametrize("filter_flag", ["--dynamic.std_filter", "--algo.dynamic_filtering_enable"])
def test_samples_generator_through_reward_file_with_dynamic_filter(local_ray, filter_flag):
    engine = ray.remote(num_cpus=0)(scripted_engine_class()).remote(local_ray, REWARD_FILE, SCRIPT)
    args = parse(filter_flag, "--rollout.n_samples_per_prompt", "4", "--rollout.batch_size", "2")
    gen = RemedySamplesGenerator(
        NS(args=args), _prompts(6), None, _tokenizer(local_ray), [engine], version_fn=lambda: 7
    )
    samples, pass_rate, consumed, exhausted = gen.generate_samples(max_new_tokens=16, max_len=64, temperature=1.0)
    # q0 and q1 have zero reward std: dropped and replaced by q2, q3 (order of arrival may vary)
    assert consumed == 4 and len(samples) == 8 and not exhausted
    assert {s.prompts[0] for s in samples} == {"q2", "q3"}
    assert pass_rate == pytest.approx(50.0)  # kept groups / generated groups, not x n
    rewards = {p: sorted(s.rewards.item() for s in samples if s.prompts[0] == p) for p in ("q2", "q3")}
    assert rewards == {"q2": [0.0, 0.0, 1.0, 1.0], "q3": [0.0, 0.0, 1.0, 1.0]}
    statuses = sum(s.info["verify/no_answer"].item() for s in samples if s.prompts[0] == "q3")
    assert statuses == 2  # the reward file's status reached the sample's info
    assert all(s.rollout_meta.policy_version == 7 for s in samples)
    assert all(s.rollout_meta.gen_cost == pytest.approx(2.0) for s in samples)  # 16 generated / 8 kept


def test_tokenizer_by_key_pickles_as_its_key():
    import pickle

    from avspo_openrlhf.trainer import engine_tokenizer as et

    tok = NS(vocab=list(range(10_000)), encode=lambda text: [len(text)])
    ref = et.TokenizerByKey(tok, "k1")
    assert ref.encode("abc") == [3] and ref.vocab is tok.vocab  # the driver's side uses it as the tokenizer
    wire = pickle.dumps(ref)
    assert len(wire) < 200 and b"k1" in wire
    with pytest.raises(RuntimeError, match="holds no tokenizer 'k1'"):
        pickle.loads(wire)
    et._HELD["k1"] = tok
    try:
        assert pickle.loads(wire) is tok
    finally:
        del et._HELD["k1"]
    # engines that cannot hold it (OpenRLHF's own) keep getting the tokenizer itself
    assert et.send_once(tok, [object()]) is tok and et.send_once(tok, []) is tok


@pytest.mark.slow
def test_an_engine_that_holds_the_tokenizer_gets_it_once(local_ray):
    """The generator gives the tokenizer to an engine with ``HoldsTokenizer`` once, at its first
    generation (the trainer's construction does not wait for the engines); every prompt's call then
    carries its key, and the engine's executor tokenizes and decodes with the held copy."""
    import pickle

    from avspo_openrlhf.trainer.engine_tokenizer import HoldsTokenizer, TokenizerByKey

    holding = type("HoldingEngine", (HoldsTokenizer, scripted_engine_class()), {})
    engine = ray.remote(num_cpus=0)(holding).remote(local_ray, REWARD_FILE, SCRIPT)
    args = parse("--rollout.n_samples_per_prompt", "2", "--rollout.batch_size", "3")
    gen = RemedySamplesGenerator(NS(args=args), _prompts(3), None, _tokenizer(local_ray), [engine])
    samples, *_ = gen.generate_samples(max_new_tokens=16, max_len=64, temperature=1.0)
    assert isinstance(gen.tokenizer, TokenizerByKey) and len(pickle.dumps(gen.tokenizer)) < 200
    rewards = {p: sorted(s.rewards.item() for s in samples if s.prompts[0] == p) for p in ("q0", "q1", "q2")}
    assert rewards == {"q0": [1.0, 1.0], "q1": [0.0, 0.0], "q2": [0.0, 1.0]}


def test_std_filter_is_exact_for_non_binary_constant_groups(local_ray):
    # OpenRLHF's range filter keeps a constant 0.5 group (0 < 0.5 < 1); the std filter drops it
    from avspo_openrlhf.algo import dynamic_sampling_keep_mask

    rewards = torch.tensor([[0.5, 0.5, 0.5, 0.5], [0.0, 1.0, 0.0, 0.0]])
    assert dynamic_sampling_keep_mask(rewards).tolist() == [False, True]


class _SlowTrainerBase:
    """Stands in for OpenRLHF's TrainingActor: a slow step and a weight sync that publishes the version."""

    def __init__(self, args, coordinator, step_s):
        self.args, self.strategy = args, NS(args=args)
        self.actor_model_group = self.critic_model_group = self.reward_model_group = None
        self.reference_model_group, self.kl_ctl, self.tokenizer = None, NS(value=0.0), None
        self.coordinator, self.step_s = coordinator, step_s

    def train_step(self, rollout_samples, global_step):
        time.sleep(self.step_s)
        ray.get(self.coordinator.set_version.remote(global_step + 1))  # broadcast_to_vllm
        return {"policy_loss": 0.0}, global_step + 1


class _SlowTrainer(RemedyTrainerMixin, _SlowTrainerBase):
    def __init__(self, *a):
        super().__init__(*a)
        self._remedy_setup()

    def _requeue(self, batches):
        ray.get(self.coordinator.requeue.remote(batches))


@pytest.mark.slow
@pytest.mark.parametrize("policy", ["regenerate", "drop"])
def test_async_staleness_bound_with_a_slow_trainer(local_ray, policy):
    script = {f"q{i}": [f"\\boxed{{{i}}}", "\\boxed{x}"] for i in range(10)}
    engine = ray.remote(num_cpus=0)(scripted_engine_class()).remote(local_ray, REWARD_FILE, script)
    args = parse(
        "--train.async_enable",
        "--rollout.batch_size",
        "1",
        "--rollout.n_samples_per_prompt",
        "2",
        "--rollout.micro_batch_size",
        "1",
        "--buffer.max_staleness",
        "1",
        "--buffer.stale_policy",
        policy,
    )
    coord = ray.remote(num_cpus=0)(AsyncCoordinator).remote()
    gen = RemedySamplesGenerator(
        NS(args=args),
        _prompts(10),
        None,
        _tokenizer(local_ray),
        [engine],
        version_fn=lambda: ray.get(coord.get_version.remote()),
        requeue_fn=lambda: ray.get(coord.take_requeued.remote()),
    )
    buffer: queue.Queue = queue.Queue(maxsize=3)  # a deep queue lets batches go stale

    def produce():  # the generator actor's loop
        while True:
            samples, _, _, exhausted = gen.generate_samples(max_new_tokens=8, max_len=64)
            if samples:
                buffer.put(samples)
            if exhausted:
                break
        buffer.put(None)

    trainer = _SlowTrainer(args, coord, 0.3)
    threading.Thread(target=produce, daemon=True).start()
    step, trained, rejected, stale_seen, seen = 0, [], [], [], []
    while (batch := buffer.get(timeout=120)) is not None:
        versions = {s.rollout_meta.policy_version for s in batch}
        seen.append((batch[0].prompts[0], min(versions)))
        status, new_step = trainer.train_step(batch, step)
        stale_seen.append(step - min(versions))
        if status.get(SKIPPED):
            assert new_step == step
            rejected.append(batch[0].prompts[0])
        else:
            assert status["async/staleness"] <= 1
            trained.append(batch[0].prompts[0])
        step = new_step
    c = trainer.counters
    assert max(stale_seen) > 1, "the test must produce over-stale batches"
    assert c["dropped_stale_batches"] == sum(s > 1 for s in stale_seen) > 0
    assert c["trained_batches"] == len(trained) == step
    if policy == "regenerate":
        assert c["requeued_prompts"] == c["dropped_stale_batches"]
        # a rejected prompt comes back, generated again with newer weights
        first = {}
        for p, v in seen:
            first.setdefault(p, v)
        assert any(p in rejected and v > first[p] for p, v in seen)
    else:
        assert c["requeued_prompts"] == 0 and len(trained) == 10 - c["dropped_stale_batches"]
        assert not set(rejected) & set(trained) and len({p for p, _ in seen}) == len(seen) == 10
