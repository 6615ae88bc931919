"""What our trainers ask of OpenRLHF's policy actor beyond its own methods: RL-ZVP's token
entropies H_t (docs/algorithm.md#rl-zvp) from the log-prob forward ``make_experience`` already runs.

:class:`TokenEntropyMixin` goes before ``PolicyModelActor`` in the MRO, after
:class:`~avspo_openrlhf.trainer.response_logits.ResponseLogitsMixin` (logits for the response
positions only); the GPU path gets
:data:`RemedyPolicyModelActor` (``install.py`` puts it where ``train(args)`` looks), the CPU backend
mixes it into its own policy actor.
"""

from __future__ import annotations

import ray
import torch
from openrlhf.trainer.ray.ppo_actor import PolicyModelActor
from openrlhf.utils.vlm_utils import merge_mm_train_inputs

from .entropy import ForwardWithEntropy, log_probs_and_entropy
from .response_logits import ResponseLogitsMixin


class TokenEntropyMixin:
    def forward(self, sequences, action_mask=None, attention_mask=None, packed_seq_lens=None,
                mm_train_inputs_list=None, entropy_rows=None):  # fmt: skip
        """OpenRLHF's ``forward`` (no-grad action log-probs). With ``entropy_rows`` (``[B]`` bool: the
        experience maker's request for a token-level remedy) the same pass also returns those rows'
        response-token entropies, as a :class:`~avspo_openrlhf.trainer.entropy.ForwardWithEntropy`."""
        if entropy_rows is None:
            return super().forward(sequences, action_mask, attention_mask, packed_seq_lens, mm_train_inputs_list)
        device = torch.cuda.current_device()
        mm_inputs = {}
        if mm_train_inputs_list and getattr(self.actor, "is_vlm", False):  # as OpenRLHF's forward
            mm_inputs = merge_mm_train_inputs(mm_train_inputs_list, device)
        self.actor.eval()
        try:
            with torch.no_grad():
                out = log_probs_and_entropy(self.actor, sequences.to(device), action_mask.to(device),
                                            attention_mask.to(device), entropy_rows,
                                            ring_attn_group=self.strategy.ring_attn_group, **mm_inputs)  # fmt: skip
        finally:
            self.actor.train()
        return ForwardWithEntropy(out.log_probs.to("cpu"), out.entropy.to("cpu"))

    def token_entropy(self, sequences, action_mask, attention_mask) -> torch.Tensor:
        """``[B, A]`` response-token entropies from a separate no-grad pass (OpenRLHF's
        ``return_entropy``), zero on padding. Training never calls it: it is the reference the
        tests hold ``forward``'s entropies to, and the second pass RL-ZVP used to pay for."""
        device = torch.cuda.current_device()
        self.actor.eval()
        try:
            with torch.no_grad():
                _, output = self.actor(sequences.to(device), action_mask.to(device), attention_mask.to(device),
                                       ring_attn_group=self.strategy.ring_attn_group, return_output=True,
                                       return_entropy=True)  # fmt: skip
        finally:
            self.actor.train()
        entropy = output.entropy[:, -action_mask.shape[1] :]
        return (entropy.float() * action_mask.to(entropy.device)).to("cpu")


class _PolicyModelActor(ResponseLogitsMixin, TokenEntropyMixin, PolicyModelActor.__ray_actor_class__):
    pass


RemedyPolicyModelActor = ray.remote(num_gpus=1)(_PolicyModelActor)
