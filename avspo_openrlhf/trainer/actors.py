"""Our policy actor for the GPU path: OpenRLHF's ``PolicyModelActor`` whose ``Actor`` projects the
response positions only (:class:`~avspo_openrlhf.trainer.response_logits.ResponseLogitsMixin`) and
whose log-prob forward also returns a token-level remedy's entropies
(:class:`~avspo_openrlhf.trainer.token_level.TokenEntropyMixin`). ``install.py`` puts
:data:`RemedyPolicyModelActor` where ``train(args)`` looks; the CPU backend mixes the same two into
its own policy actor.
"""

from __future__ import annotations

import ray
from openrlhf.trainer.ray.ppo_actor import PolicyModelActor

from .response_logits import ResponseLogitsMixin
from .token_level import TokenEntropyMixin


class _PolicyModelActor(ResponseLogitsMixin, TokenEntropyMixin, PolicyModelActor.__ray_actor_class__):
    pass


RemedyPolicyModelActor = ray.remote(num_gpus=1)(_PolicyModelActor)
