"""What our trainers ask of OpenRLHF's policy actor beyond its own methods: token entropies of
given responses under the current weights (RL-ZVP's H_t, docs/algorithm.md#rl-zvp).

:class:`TokenEntropyMixin` goes before ``PolicyModelActor`` in the MRO; the GPU path gets
:data:`AVSPOPolicyModelActor` (``install.py`` puts it where ``train(args)`` looks), the CPU backend
mixes it into its own policy actor.
"""

from __future__ import annotations

import ray
import torch
from openrlhf.trainer.ray.ppo_actor import PolicyModelActor


class TokenEntropyMixin:
    def token_entropy(self, sequences, action_mask, attention_mask) -> torch.Tensor:
        """``[B, A]`` full-vocabulary entropy of each response token (temperature-scaled as the rollout
        sampled), zero on padding. A no-grad forward pass like OpenRLHF's ``forward`` (log-probs)."""
        device = torch.cuda.current_device()
        self.actor.eval()
        try:
            with torch.no_grad():
                _, output = self.actor(
                    sequences.to(device),
                    action_mask.to(device),
                    attention_mask.to(device),
                    ring_attn_group=self.strategy.ring_attn_group,
                    return_output=True,
                    return_entropy=True,
                )
        finally:
            self.actor.train()
        entropy = output.entropy[:, -action_mask.shape[1] :]
        return (entropy.float() * action_mask.to(entropy.device)).to("cpu")


class _PolicyModelActor(TokenEntropyMixin, PolicyModelActor.__ray_actor_class__):
    pass


AVSPOPolicyModelActor = ray.remote(num_gpus=1)(_PolicyModelActor)
