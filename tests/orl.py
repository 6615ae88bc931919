"""Test helpers for the OpenRLHF integration: complete args from the real parser, rollout samples
shaped like OpenRLHF's samples generator makes them, and a scripted rollout engine that runs
OpenRLHF's own agent executor and reward-file path without vLLM."""

from __future__ import annotations

import itertools
from types import SimpleNamespace as NS

import torch

from avspo_openrlhf.cli.train import run

BASE_FLAGS = [
    "--actor.model_name_or_path", "unused",
    "--actor.num_gpus_per_node", "1",
    "--algo.advantage.estimator", "group_norm",
    "--rollout.n_samples_per_prompt", "8",
    "--rollout.batch_size", "4",
    "--rollout.micro_batch_size", "4",
    "--reward.remote_url", "reward.py",
]  # fmt: skip


def parse(*flags: str, base=BASE_FLAGS):
    """OpenRLHF's parser + ours, all of its validation, no training."""
    return run([*base, *flags], dry_run=True)


def rollout_samples(rewards: torch.Tensor, lengths: torch.Tensor | None = None, prompt_len: int = 3, seed: int = 0):
    """One single-sample ``Experience`` per completion, grouped by prompt as OpenRLHF's
    ``SamplesGenerator`` emits them; ``rewards``/``lengths`` are ``[N, G]``."""
    from openrlhf.trainer.ppo_utils.experience import Experience

    n, g = rewards.shape
    lengths = torch.full((n, g), 4) if lengths is None else lengths
    gen = torch.Generator().manual_seed(seed)
    out = []
    for j, i in itertools.product(range(n), range(g)):
        resp = int(lengths[j, i])
        total = prompt_len + resp
        r = float(rewards[j, i])
        out.append(
            Experience(
                sequences=torch.randint(5, 50, (1, total), generator=gen),
                attention_mask=torch.ones(1, total, dtype=torch.long),
                action_mask=torch.cat([torch.zeros(prompt_len - 1), torch.ones(resp)]).bool()[None],
                prompts=[f"prompt {j}"],
                labels=[str(j)],
                rewards=torch.tensor([r]),
                scores=torch.tensor([r]),
                response_length=torch.tensor([resp]),
                truncated=torch.tensor([False]),
                total_length=torch.tensor([float(total)]),
                info={"reward": torch.tensor([r])},
            )
        )
    return out


def make_maker(args, maker_cls, kl_coef: float = 0.0):
    """An experience maker with no model groups (advantage computation only)."""
    tok = NS(pad_token_id=0)
    return maker_cls(None, None, None, None, NS(value=kl_coef), NS(args=args), tok)


def experiences_with_kl(maker, samples, kl_seed: int = 1):
    """OpenRLHF's own ``split_rollout_samples``, then the per-token KL ``make_experience`` would add."""
    exps = maker.split_rollout_samples(samples)
    gen = torch.Generator().manual_seed(kl_seed)
    for e in exps:
        e.kl = torch.rand(e.action_mask.shape, generator=gen) * 0.1 * e.action_mask
    return exps


def sample_advantage(exps) -> torch.Tensor:
    """Advantage at each sample's first action token, in original sample order."""
    out = {}
    for e in exps:
        first = e.action_mask.float().argmax(dim=1)
        for k, idx in enumerate(e.index):
            out[idx] = e.advantages[k, first[k]].item()
    return torch.tensor([out[i] for i in sorted(out)])


def scripted_engine_class():
    """A rollout engine with OpenRLHF's ``RolloutRayActor`` interface whose LLM is a script: the
    real ``generate_responses`` and ``SingleTurnAgentExecutor`` (tokenize, decode, reward file) run;
    only ``generate`` returns scripted completions. ``script[prompt]`` cycles through completions."""
    from openrlhf.trainer.ray.vllm_engine import RolloutRayActor
    from openrlhf.utils.agent import SingleTurnAgentExecutor
    from transformers import AutoTokenizer

    class ScriptedEngine(RolloutRayActor.__ray_actor_class__):
        def __init__(self, tokenizer_path: str, reward_file: str, script: dict, delay_s: float = 0.0):
            self.executor = SingleTurnAgentExecutor(reward_file)
            self.tok = AutoTokenizer.from_pretrained(tokenizer_path)
            self.script, self.delay_s = script, delay_s
            self.calls: dict[str, int] = {}

        async def generate(self, prompt_token_ids, sampling_params, multi_modal_data=None):
            import asyncio

            prompt = self.tok.decode(prompt_token_ids)
            i = self.calls.get(prompt, 0)
            self.calls[prompt] = i + 1
            completions = self.script[prompt]
            text = completions[i % len(completions)]
            if self.delay_s:
                await asyncio.sleep(self.delay_s)
            ids = self.tok(text, add_special_tokens=False)["input_ids"] + [self.tok.eos_token_id]
            return NS(outputs=[NS(token_ids=ids, finish_reason="stop", logprobs=None)])

        def get_num_unfinished_requests(self) -> int:
            return 0

        def prompt_calls(self) -> dict:
            return dict(self.calls)

    return ScriptedEngine
