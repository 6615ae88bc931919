"""The response-only vocabulary projection (trainer/response_logits.py) returns what OpenRLHF's
``Actor.forward`` returns, gradients included, projecting A + 1 positions instead of all of them."""

from __future__ import annotations

import inspect

import pytest
import torch

pytest.importorskip("openrlhf")


def _actors(tmp_path, **kw):
    from openrlhf.models import Actor

    from avspo_openrlhf.cpu.tiny import build_tiny_model

    path = build_tiny_model(str(tmp_path / "tiny"))
    make = lambda: Actor(path, attn_implementation="eager", param_dtype="bf16", temperature=0.7, **kw).float()  # noqa: E731
    return make(), make()


def _batch():
    gen = torch.Generator().manual_seed(0)
    seq = torch.randint(5, 300, (4, 14), generator=gen)
    prompt_mask = torch.tensor([[0, 0, 1, 1, 1, 1], [1] * 6, [0, 0, 0, 0, 1, 1], [0] + [1] * 5])  # left padding
    action_mask = torch.tensor([[1] * 8, [1] * 5 + [0] * 3, [1] * 8, [1] * 2 + [0] * 6], dtype=torch.bool)
    attention_mask = torch.cat([prompt_mask, action_mask.long()], dim=1)
    return seq * attention_mask, action_mask, attention_mask


def test_log_probs_entropies_logits_and_gradients_equal_openrlhfs(tmp_path):
    from avspo_openrlhf.trainer.response_logits import ResponseLogitsActor, use_response_logits

    ours, theirs = _actors(tmp_path)
    assert use_response_logits(ours) and type(ours) is ResponseLogitsActor
    seq, action_mask, attention_mask = _batch()
    a = action_mask.shape[1]
    projected = []
    ours.model.lm_head.register_forward_hook(lambda m, args, out: projected.append(args[0].shape[1]))
    with torch.compiler.set_stance("force_eager"):  # OpenRLHF's compute_entropy is torch.compile'd
        got, got_out = ours(seq, action_mask, attention_mask, return_output=True, return_entropy=True)
        want, want_out = theirs(seq, action_mask, attention_mask, return_output=True, return_entropy=True)
    assert projected == [a + 1]  # not the 14 positions of prompt + response
    assert torch.allclose(got, want, atol=1e-6) and (got[~action_mask] == 0).all()
    # what OpenRLHF's training step (entropy[:, -A:]) and RL-ZVP (logits[:, -A-1:-1]) read
    assert torch.allclose(got_out.entropy[:, -a:], want_out.entropy[:, -a:], atol=1e-5)
    assert torch.allclose(got_out["logits"][:, -a - 1 : -1], want_out["logits"][:, -a - 1 : -1], atol=1e-6)
    adv = torch.randn(action_mask.shape, generator=torch.Generator().manual_seed(1))
    (got * adv).sum().backward()
    (want * adv).sum().backward()
    for (name, p), q in zip(ours.named_parameters(), theirs.parameters(), strict=True):
        assert torch.allclose(p.grad, q.grad, atol=1e-6), name


def test_the_monitors_entropy_carries_no_graph(tmp_path):
    """With no entropy term in the loss (``--actor.entropy_coef`` 0 or unset: the entropy monitor's),
    the entropies come without autograd, equal, and the log-probs' gradients are unchanged."""
    from avspo_openrlhf.trainer.response_logits import use_response_logits

    plain, graphless = _actors(tmp_path)
    assert use_response_logits(plain) and use_response_logits(graphless, entropy_grad=False)
    seq, action_mask, attention_mask = _batch()
    with torch.compiler.set_stance("force_eager"):
        got, got_out = graphless(seq, action_mask, attention_mask, return_output=True, return_entropy=True)
        want, want_out = plain(seq, action_mask, attention_mask, return_output=True, return_entropy=True)
    assert want_out.entropy.requires_grad and not got_out.entropy.requires_grad
    assert torch.equal(got_out.entropy, want_out.entropy.detach()) and torch.equal(got, want)
    got.sum().backward()
    want.sum().backward()
    for p, q in zip(graphless.parameters(), plain.parameters(), strict=True):
        assert torch.equal(p.grad, q.grad)


def test_rl_zvps_entropies_through_the_response_only_forward(tmp_path):
    from avspo_openrlhf.trainer.response_logits import use_response_logits
    from avspo_openrlhf.trainer.token_level import log_probs_and_entropy

    ours, theirs = _actors(tmp_path)
    use_response_logits(ours)
    seq, action_mask, attention_mask = _batch()
    rows = torch.tensor([True, False, True, True])
    with torch.no_grad(), torch.compiler.set_stance("force_eager"):
        got = log_probs_and_entropy(ours.eval(), seq, action_mask, attention_mask, rows)
        want = log_probs_and_entropy(theirs.eval(), seq, action_mask, attention_mask, rows)
    assert torch.allclose(got.log_probs, want.log_probs, atol=1e-6)
    assert torch.allclose(got.entropy, want.entropy, atol=1e-5)


def test_other_cases_go_to_openrlhfs_forward(tmp_path):
    from avspo_openrlhf.trainer.response_logits import use_response_logits

    packed, _ = _actors(tmp_path, packing_samples=True)
    assert not use_response_logits(packed)  # packed rows: OpenRLHF's forward, unchanged
    ours, theirs = _actors(tmp_path)
    use_response_logits(ours)
    seq, _, attention_mask = _batch()
    with torch.no_grad():  # no action mask: every position's log-probs, as OpenRLHF returns them
        assert torch.equal(
            ours(seq, None, attention_mask, return_logprobs=True),
            theirs(seq, None, attention_mask, return_logprobs=True),
        )


def test_the_openrlhf_surface_it_relies_on():
    """``Actor.forward``'s parameters in the order our override passes them on, and transformers'
    ``logits_to_keep`` on the causal LMs we train."""
    from openrlhf.models import Actor
    from transformers import LlamaForCausalLM, Qwen2ForCausalLM

    assert list(inspect.signature(Actor.forward).parameters) == [
        "self",
        "sequences",
        "action_mask",
        "attention_mask",
        "return_output",
        "allgather_logits",
        "return_logprobs",
        "ring_attn_group",
        "packed_seq_lens",
        "return_entropy",
        "mm_inputs",
    ]
    for cls in (LlamaForCausalLM, Qwen2ForCausalLM):
        assert "logits_to_keep" in inspect.signature(cls.forward).parameters
