"""The remedies study's controls and its common random numbers: small pure functions the study loop
(``study/loop.py``) calls, kept apart so that each is tested on its own.

- :func:`random_sign_advantages`: the virtual-sample family's control. Each collapsed group gets
  A = +1 or -1 from a fair coin that ignores its rewards (GRPO elsewhere): a push of AVSPO's size with
  no information in its sign. AVSPO's ``random_uniform`` strategy is not such a control: its virtual
  values lie in the reward range, so an all-wrong group is always pushed down.
- :func:`format_reward`: 1 for any completion with an extractable answer, whatever its value: the
  gain that needs no correct answer (the answer format).
- :func:`sampling_seed`: the seed of one generation round of one step of one run, a function of
  (seed, step, round) only, so two arms with one seed draw the same random numbers at every step.
"""

from __future__ import annotations

import hashlib

import torch


def sampling_seed(seed: int, step: int, round_: int, stream: str = "sample") -> int:
    """A 63-bit seed for one (run seed, step, generation round) of one random ``stream``: the same in
    every arm, unrelated between neighbouring steps (a hash, not a sum that two steps could share)."""
    digest = hashlib.sha256(f"{stream}/{int(seed)}/{int(step)}/{int(round_)}".encode()).digest()
    return int.from_bytes(digest[:8], "little") & (2**63 - 1)


def random_sign_advantages(adv: torch.Tensor, collapsed: torch.Tensor, generator: torch.Generator) -> torch.Tensor:
    """``adv`` ``[N, G]`` with every collapsed group's row replaced by +1 or -1 from a fair coin.

    One coin is drawn for every group, collapsed or not, so the draws of a step do not depend on
    which groups collapsed (two arms with one seed draw the same coins)."""
    coin = torch.randint(0, 2, (adv.shape[0],), generator=generator, device=generator.device)
    sign = (2.0 * coin - 1.0).to(device=adv.device, dtype=adv.dtype)
    return torch.where(collapsed.to(adv.device)[:, None], sign[:, None].expand_as(adv), adv)


def format_reward(reward: str):
    """``texts -> [0/1]``: 1 where the task's extraction finds an answer (``arith``: a boxed integer or
    the last integer; ``math``: a box, an answer phrase or ####), whatever its value."""
    if reward == "arith":
        from avspo_openrlhf.rewards.arith_reward import arith_answer

        return lambda texts: [float(arith_answer(t)[0] is not None) for t in texts]
    if reward == "math":
        from avspo_openrlhf.rewards.extract import extract_answer

        return lambda texts: [float(extract_answer(t)[0] is not None) for t in texts]
    raise ValueError(f"the format control needs the arith or math reward (its answer extraction), got {reward!r}")
