"""The CPU backend's speed choices keep the training the same: the skipped old-log-prob
pass, the OpenMP wait policy per mode, the quickstart's mode per machine."""

from __future__ import annotations

import pytest
import torch

from avspo_openrlhf.cpu.cores import thread_env


def test_passive_openmp_waiting_only_where_engine_and_trainer_share_cores_at_once():
    assert thread_env(True, False, {}) == {"OMP_WAIT_POLICY": "PASSIVE"}  # async, shared cores
    assert thread_env(False, False, {}) == {}  # sync: one phase at a time, OpenMP's own short spin
    assert thread_env(True, True, {}) == {}  # async on disjoint cores: each process alone on its own
    assert thread_env(False, False, {"OMP_WAIT_POLICY": "ACTIVE"}) == {"OMP_WAIT_POLICY": "ACTIVE"}  # the user's


def _quickstart_args(tmp_path, *extra):
    from avspo_openrlhf.cli import quickstart as qs
    from avspo_openrlhf.cli.train import run
    from avspo_openrlhf.cpu.tiny import build_tiny_model

    model = build_tiny_model(str(tmp_path / "tiny"))
    data = tmp_path / "train.jsonl"
    data.write_text('{"prompt": "1+1", "answer": "2"}\n')
    qargs = qs.build_parser().parse_args(["--", *extra] if extra else [])
    return run(qs.train_flags(qargs, model, str(data), tmp_path / "run"), dry_run=True)


@pytest.mark.parametrize(
    "extra, current",
    [
        ((), True),  # the quickstart: one optimizer step per batch, one epoch, no reference
        (("--train.async_enable",), True),  # async: the pass ran on the trainer's current weights too
        (("--train.batch_size", "8"), False),  # two optimizer steps per batch: the second needs them
        (("--train.max_epochs", "2"), False),
        (("--algo.kl.init_coef", "0.01"), False),  # the KL to the reference reads them
        (("--algo.advantage.is_correction_level", "token"), False),
    ],
)
def test_old_log_probs_are_skipped_only_when_they_equal_the_training_forwards(tmp_path, extra, current):
    from avspo_openrlhf.trainer.old_log_probs import old_log_probs_are_current

    assert old_log_probs_are_current(_quickstart_args(tmp_path, *extra)) is current


def test_the_loss_on_a_skipped_pass_is_the_loss_on_the_old_log_probs_it_would_have_returned():
    """The policy loss fed NaN placeholders (a skipped pass, padding re-collated as 0) computes the
    value and gradient it computes from real old log-probs equal to the training forward's; real
    old log-probs (an RL-ZVP pass that ran) reach the loss unchanged."""
    from openrlhf.models import PolicyLoss

    from avspo_openrlhf.trainer.old_log_probs import OldIsCurrent

    g = torch.Generator().manual_seed(0)
    logits = torch.randn(4, 6, generator=g)
    adv = torch.randn(4, 6, generator=g)
    mask = torch.ones(4, 6, dtype=torch.bool)
    mask[2, 4:] = False

    def loss_and_grad(loss_fn, old):
        x = logits.clone().requires_grad_(True)
        log_probs = torch.nn.functional.logsigmoid(x)
        loss = loss_fn(log_probs, old(log_probs), adv, action_mask=mask)[0]
        loss.backward()
        return loss.detach(), x.grad

    placeholder = torch.full((4, 6), float("nan"))
    placeholder[2, 4:] = 0.0  # the replay buffer re-pads a re-collated batch with zeros
    wrapped = OldIsCurrent(PolicyLoss())
    got = loss_and_grad(wrapped, lambda lp: placeholder)
    want = loss_and_grad(PolicyLoss(), lambda lp: lp.detach())
    assert torch.isfinite(got[0]) and torch.equal(got[0], want[0]) and torch.equal(got[1], want[1])
    stale = torch.nn.functional.logsigmoid(logits) - 0.3  # a real old pass: used as given
    assert torch.equal(loss_and_grad(wrapped, lambda lp: stale)[0], loss_and_grad(PolicyLoss(), lambda lp: stale)[0])
    assert wrapped.clip_eps_low == 0.2  # attributes OpenRLHF reads still reach the loss


def test_the_quickstart_runs_sync_below_four_cores_and_async_from_four(tmp_path, monkeypatch):
    import os

    from avspo_openrlhf.cli import quickstart as qs
    from avspo_openrlhf.cpu.cores import default_rollout_mode

    assert [default_rollout_mode(n) for n in (1, 2, 3, 4, 64)] == ["sync", "sync", "sync", "async", "async"]
    for cores, want_async in (({0, 1}, False), ({0, 1, 2, 3}, True)):
        monkeypatch.setattr(os, "sched_getaffinity", lambda pid, c=cores: c)
        args = qs.build_parser().parse_args([])
        assert ("--train.async_enable" in qs.train_flags(args, "m", "t.jsonl", tmp_path)) is want_async
    assert qs.build_parser().parse_args(["--async"]).sync is False  # the user's choice wins either way
    assert qs.build_parser().parse_args(["--sync"]).sync is True
