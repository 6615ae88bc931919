"""trainer/token_level.py serves any registered estimator with a ``token_fn``, not RL-ZVP by name:
a throwaway estimator's token advantages reach the experiences (the log-prob pass's entropies) and
the loss (the training forward's, through a ``TokenRequest`` per response that survives OpenRLHF's
replay buffer), with its own config and its own metric names."""

from dataclasses import dataclass

import pytest
import torch
from local_actors import ScriptedPolicyGroup, in_process_ray, maker_for
from orl import parse, rollout_samples, sample_advantage

pytest.importorskip("openrlhf")

from avspo_openrlhf.algo import CollapseController, zero_variance_sign  # noqa: E402
from avspo_openrlhf.algo.advantages import ESTIMATORS, grpo_affine, register_estimator  # noqa: E402

G = 4
REWARDS = torch.tensor([[1.0, 1, 1, 1], [1, 0, 1, 0], [0, 0, 0, 0]])  # all-right, mixed, all-wrong
LENGTHS = torch.tensor([[3, 5, 4, 6], [5, 5, 2, 3], [6, 4, 3, 5]])
NAME = "tokens_for_test"


@dataclass(frozen=True)
class _Scale:
    scale: float = 3.0


def _token_fn(entropy, mask, sign, cfg: _Scale):
    return cfg.scale * sign.to(entropy.dtype)[:, None] * entropy * mask


@pytest.fixture(autouse=True)
def _estimator(monkeypatch):
    in_process_ray(monkeypatch)

    @register_estimator(NAME, _Scale, token_fn=_token_fn)
    def _fn(stats, cfg, ctx):
        return *grpo_affine(stats, "population", 1e-6), {"num_effective_collapsed": 0}

    yield
    ESTIMATORS.pop(NAME)


def _maker(group, config=_Scale(scale=0.5)):
    args = parse(
        "--rollout.n_samples_per_prompt", str(G), "--rollout.batch_size", "3", "--rollout.micro_batch_size", "4"
    )
    return maker_for(args, group, controller=CollapseController(NAME, config))


def test_another_token_level_estimator_gets_its_own_token_advantages_from_the_log_prob_pass():
    group = ScriptedPolicyGroup()
    maker = _maker(group)
    exps = maker.make_experience_batch(rollout_samples(REWARDS, LENGTHS))
    assert group.calls == ["forward"] * len(exps)
    sign = zero_variance_sign(REWARDS)
    for e in exps:
        s = sign[torch.tensor(e.index) // G]
        tokens = e.sequences[:, -e.action_mask.shape[1] :].float()
        h = (0.1 + 0.07 * (tokens % 13)) * e.action_mask  # the scripted policy's entropies
        want = 0.5 * s[:, None].float() * h
        rows = s != 0
        assert torch.allclose(e.advantages[rows] * e.action_mask[rows], want[rows], atol=1e-6)
    assert sample_advantage(exps).reshape(REWARDS.shape)[1].abs().sum() > 0  # the mixed group: GRPO
    assert maker.last_metrics[f"{NAME}/zero_variance_samples"] == 8
    assert maker.last_metrics[f"{NAME}/entropy_mean"] > 0 and "rl_zvp/entropy_mean" not in maker.last_metrics


def test_deferred_requests_survive_the_replay_buffer_and_reach_the_loss():
    from openrlhf.trainer.ppo_utils.experience import make_experience_batch, split_experience_batch

    from avspo_openrlhf.trainer.old_log_probs import OldIsCurrent
    from avspo_openrlhf.trainer.response_logits import ResponseLogitsActor
    from avspo_openrlhf.trainer.token_level import TOKEN_REQUEST, TokenLevelTraining, TokenRequest

    maker = _maker(ScriptedPolicyGroup(), config=_Scale(scale=2.0))
    maker._token_setup(skips_old_pass=True)  # as on the CPU path: the entropies come from training
    exps = maker.make_experience_batch(rollout_samples(REWARDS, LENGTHS))
    items = [item for e in exps for item in split_experience_batch(e)]  # what the replay buffer holds
    batch = make_experience_batch(items[2:10])  # a micro-batch across groups
    requests = batch.info[TOKEN_REQUEST]
    assert all(isinstance(r, TokenRequest) and r.estimator == NAME and r.config == _Scale(2.0) for r in requests)
    sign = torch.tensor([r.sign for r in requests])
    assert sign.tolist() == [1, 1, 0, 0, 0, 0, -1, -1]

    actor = ResponseLogitsActor.__new__(ResponseLogitsActor)
    torch.nn.Module.__init__(actor)
    entropy = torch.rand(batch.action_mask.shape)
    seen = {}

    def loss(log_probs, old, advantages, action_mask=None):
        seen["advantages"] = advantages
        return (log_probs * 0).sum()

    def training_step(experience, *args):  # OpenRLHF's order: the forward, then the loss, then info
        idx = actor.entropy_rows.nonzero().flatten()
        actor.kept_entropy = entropy[idx]  # what the response-only forward keeps for those rows
        trainer.actor_loss_fn(torch.zeros_like(entropy), torch.zeros_like(entropy), experience.advantages)
        return dict(experience.info)

    trainer = type("Trainer", (), {})()
    trainer.actor, trainer.actor_loss_fn, trainer.training_step = actor, loss, training_step
    step = TokenLevelTraining(trainer)
    assert trainer.training_step is step and isinstance(trainer.actor_loss_fn, OldIsCurrent)
    before = batch.advantages.clone()
    info = trainer.training_step(batch)
    rows = sign != 0
    mask = batch.action_mask[rows]
    want = before.clone()
    want[rows] += 2.0 * sign[rows].float()[:, None] * entropy[rows] * mask
    assert torch.equal(seen["advantages"], want)
    assert TOKEN_REQUEST not in info  # taken out before OpenRLHF logs info
    assert actor.entropy_rows is None and trainer.actor_loss_fn.with_token_advantages is None  # reset after
    m = step.metrics()
    assert m[f"{NAME}/entropy_mean"] == pytest.approx(float((entropy[rows] * mask).sum() / mask.sum()))
    assert step.metrics() == {}  # reset: no request since
