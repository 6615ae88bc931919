"""The process-per-run engine of the study loop: one run's own transformers model and torch AdamW
(``HFEngine``), the ``Policy`` that encodes prompts, samples completions with the run's common
random numbers and computes the completion tokens' log-probs, and the training forward's attention
rule (``training_attention_mask``). It serves the requests of ``study/protocol.py``; the stacked
engine (``study/engine.py``) serves the same requests for K runs at once."""

from __future__ import annotations

import contextlib

import torch

from avspo_openrlhf.study.fingerprint import (
    chat_prompts,
    settings_difference,  # noqa: F401  re-exported: remedies_gpu and the tests import it from here
)
from avspo_openrlhf.study.objective import (
    causal_mask,
    diagnosis,
    masked_finite,
    policy_loss,
    token_logprobs_entropy,
)
from avspo_openrlhf.study.protocol import Generate, Rollout, Update
from avspo_openrlhf.study.spec import RunSpec, StudySettings, device_and_dtype
from avspo_openrlhf.study.stacked import draw_tokens, draw_uniforms, sliding_window


def load_policy(model: str, device: torch.device):
    """Weights in fp32 (the optimizer's master copy; compute precision comes from autocast)."""
    from transformers import AutoModelForCausalLM, AutoTokenizer

    tok = AutoTokenizer.from_pretrained(model, padding_side="left")
    tok.pad_token = tok.pad_token or tok.eos_token
    policy = AutoModelForCausalLM.from_pretrained(model, dtype=torch.float32).to(device)
    eos = policy.generation_config.eos_token_id
    eos_ids = sorted({*(eos if isinstance(eos, list) else [eos] if eos is not None else []), tok.eos_token_id})
    return policy, tok, torch.tensor(eos_ids, device=device)


def completion_mask(comp: torch.Tensor, eos_ids: torch.Tensor) -> torch.Tensor:
    """``[B, T]`` 1 for the completion's tokens up to and including its first EOS, 0 after it."""
    is_eos = torch.isin(comp, eos_ids).long()
    return ((is_eos.cumsum(-1) - is_eos) == 0).long()


class DrawnToken:
    """A transformers logits processor: the scores made one-hot (0 at one token, -inf elsewhere) at
    ``stacked.draw_tokens``' draw from them with the rows' uniforms ``[B, T]`` of this step; greedy
    search then emits that token. ``prompt_width``: the prompts' padded length (step = length - it)."""

    def __init__(self, uniforms: torch.Tensor, temperature: float, prompt_width: int):
        self.uniforms, self.temperature, self.prompt_width = uniforms, temperature, prompt_width

    def __call__(self, input_ids: torch.Tensor, scores: torch.Tensor) -> torch.Tensor:
        # a deferred stop check (transformers on some devices) runs one step past the last, then undoes it
        t = min(input_ids.shape[1] - self.prompt_width, self.uniforms.shape[1] - 1)
        tok = draw_tokens(scores, self.uniforms[:, t], self.temperature)
        return torch.full_like(scores, float("-inf")).scatter_(-1, tok[:, None], 0.0)


class Policy:
    """The model (when ``load_model``), its tokenizer and how this run computes with it. Without the
    model (the stacked engine holds the weights of many runs) it still encodes prompts and turns
    sampled completions into a :class:`Rollout`."""

    def __init__(self, model: str, settings: StudySettings, load_model: bool = True):
        from transformers import AutoTokenizer

        self.device, self.dtype = device_and_dtype(settings)
        if load_model:
            self.model, self.tok, self.eos_ids = load_policy(model, self.device)
        else:
            from transformers import GenerationConfig

            self.model = None
            self.tok = AutoTokenizer.from_pretrained(model, padding_side="left")
            self.tok.pad_token = self.tok.pad_token or self.tok.eos_token
            try:
                eos = GenerationConfig.from_pretrained(model).eos_token_id
            except OSError:
                eos = None
            eos_ids = {*(eos if isinstance(eos, list) else [eos] if eos is not None else []), self.tok.eos_token_id}
            self.eos_ids = torch.tensor(sorted(eos_ids), device=self.device)
        self.template = settings.template

    def autocast(self):
        return torch.autocast(self.device.type, dtype=self.dtype, enabled=self.dtype != torch.float32)

    def chats(self, problems: list[str]) -> list[str]:
        return chat_prompts(self.tok, problems, self.template)  # what the prompts' hash renders too

    def encode(self, problems: list[str]) -> tuple[torch.Tensor, torch.Tensor]:
        """Left-padded prompt ids and attention mask ``[P, Lp]`` on the run's device."""
        enc = self.tok(self.chats(problems), return_tensors="pt", padding=True).to(self.device)
        return enc["input_ids"], enc["attention_mask"]

    def rollout(self, parts: list[tuple[torch.Tensor, torch.Tensor, torch.Tensor]]) -> Rollout:
        """A :class:`Rollout` from sampled parts ``(prompt ids [B, Lp], prompt mask [B, Lp], completion
        [B, T])`` (prompts left-padded, completions padded after their EOS), merged in order."""
        tok = self.tok
        width_p = max(p.shape[1] for p, _, _ in parts)
        width_c = max(c.shape[1] for _, _, c in parts)
        ids, attn, mask, trunc = [], [], [], []
        for p, a, c in parts:
            m = completion_mask(c, self.eos_ids)
            trunc.append(~torch.isin(c, self.eos_ids).any(-1))
            left, right = width_p - p.shape[1], width_c - c.shape[1]
            ids.append(
                torch.cat(
                    [
                        torch.nn.functional.pad(p, (left, 0), value=tok.pad_token_id),
                        torch.nn.functional.pad(c, (0, right), value=tok.pad_token_id),
                    ],
                    1,
                )
            )
            attn.append(torch.cat([torch.nn.functional.pad(a, (left, 0)), torch.nn.functional.pad(m, (0, right))], 1))
            mask.append(torch.nn.functional.pad(m, (0, right)))
        ids, attn, mask = torch.cat(ids), torch.cat(attn), torch.cat(mask)
        texts = tok.batch_decode(ids[:, width_p:] * mask + tok.pad_token_id * (1 - mask), skip_special_tokens=True)
        return Rollout(ids, attn, mask, texts, torch.cat(trunc).cpu())

    @torch.no_grad()
    def generate(
        self, problems: list[str], n: int, max_new_tokens: int, temperature: float, batch: int, seed: int = 0
    ) -> Rollout:
        """``n`` completions of each problem (rows: each problem repeated ``n`` times), ``batch`` rows
        per ``generate`` call. Sampled as the stacked engine samples: row b's token t is the inverse-CDF
        draw of uniform ``[b, t]`` of ``seed`` (``stacked.draw_uniforms``, ``stacked.draw_tokens``;
        temperature 0: greedy), so a row's tokens do not depend on ``batch`` nor on the other rows."""
        from transformers import LogitsProcessorList

        ids, attn = self.encode(problems)  # padded as the stacked engine pads: one width for all rows
        ids, attn = ids.repeat_interleave(n, 0), attn.repeat_interleave(n, 0)
        uniforms = draw_uniforms(seed, ids.shape[0], max_new_tokens).to(self.device)
        parts = []
        self.model.eval()
        for i in range(0, ids.shape[0], batch):
            rows = slice(i, i + batch)
            with self.autocast():
                out = self.model.generate(
                    input_ids=ids[rows],
                    attention_mask=attn[rows],
                    do_sample=False,  # greedy on the scores DrawnToken made one-hot at its draw
                    logits_processor=LogitsProcessorList([DrawnToken(uniforms[rows], temperature, ids.shape[1])]),
                    max_new_tokens=max_new_tokens,
                    eos_token_id=self.eos_ids.tolist(),  # the stacked engine's: a row ends at any of them
                    pad_token_id=self.tok.pad_token_id,
                )
            parts.append((ids[rows], attn[rows], out[:, ids.shape[1] :]))
        return self.rollout(parts)

    def logprobs_entropy(
        self,
        ids: torch.Tensor,
        attn: torch.Tensor,
        width_c: int,
        entropy: bool,
        temperature: float,
        autocast: bool = True,
    ):
        """Log-probs ``[B, T]`` of the completion tokens under the sampling policy softmax(logits / T)
        (with grad) and, when asked, its entropies (no grad); logits only at the completion's positions."""
        pos = (attn.cumsum(-1) - 1).clamp_min(0)
        cfg = self.model.config
        window = sliding_window(cfg)
        if window is not None and attn.shape[1] > window:  # the 4D mask below is full causal: refuse rather than differ
            raise ValueError(
                f"a training batch of {attn.shape[1]} tokens is longer than the model's sliding window ({window}); "
                "the study loop's training mask (hf_engine.training_attention_mask) does not apply a window"
            )
        mask = training_attention_mask(attn, getattr(cfg, "_attn_implementation", "sdpa"))
        with self.autocast() if autocast else contextlib.nullcontext():
            logits = self.model(
                input_ids=ids, attention_mask=mask, position_ids=pos, logits_to_keep=width_c + 1
            ).logits[:, :-1]
        return token_logprobs_entropy(logits, ids[:, -width_c:], temperature, entropy)


class HFEngine:
    """One run's engine: its own transformers model and torch AdamW (the process-per-run engine)."""

    def __init__(self, spec: RunSpec, controller):
        s = spec.settings
        self.settings, self.controller = s, controller
        self.policy = Policy(spec.model, s)
        lr = spec.arm.lr if spec.arm.lr is not None else s.lr
        self.optimizer = torch.optim.AdamW(self.policy.model.parameters(), lr=lr, betas=(0.9, 0.95), weight_decay=0.0)

    def serve(self, req):
        if isinstance(req, Generate):  # its draws from the request's seed alone, not the global RNG
            return self.policy.generate(
                req.problems, req.n, req.max_new_tokens, req.temperature, req.batch, seed=req.seed
            )
        return self._update(req)

    def model_state(self) -> dict:
        return self.policy.model.state_dict()

    def optimizer_state(self) -> dict:
        return self.optimizer.state_dict()

    def load_states(self, model: dict, optimizer: dict) -> None:
        self.policy.model.load_state_dict(model)
        self.optimizer.load_state_dict(optimizer)

    def _backward(self, ro: Rollout, adv: torch.Tensor, sign: torch.Tensor | None, autocast: bool = True) -> dict:
        """The gradient of - mean over completion tokens of A * log pi_T (token advantages added for a
        token-level estimator), micro-batched with the whole batch's token count as the divisor."""
        s, ctrl = self.settings, self.controller
        width_c = ro.mask.shape[1]
        mask = ro.mask.float()
        total = mask.sum().clamp_min(1.0)
        out = {
            "loss": 0.0,
            "entropy_sum": 0.0,
            "tok_adv_sum": 0.0,
            "loss_finite": True,
            "logprobs_finite": True,
            "entropy_finite": True,
        }
        self.optimizer.zero_grad(set_to_none=True)
        for i in range(0, ro.ids.shape[0], s.micro_batch):
            sl = slice(i, i + s.micro_batch)
            lp, ent = self.policy.logprobs_entropy(ro.ids[sl], ro.attn[sl], width_c, True, s.temperature, autocast)
            m = mask[sl]
            a = adv[sl, None].expand_as(lp)
            out["entropy_finite"] &= bool(masked_finite(ent, m))
            if ctrl.needs_entropy and out["entropy_finite"]:  # else the step is skipped (and RL-ZVP's would raise)
                tok_adv = ctrl.token_advantages(ent, m, sign[sl].to(ent.device))
                a = a + tok_adv
                out["tok_adv_sum"] += float((tok_adv.abs() * m).sum())
            loss = policy_loss(lp, a, m, total)
            loss.backward()
            out["loss"] += float(loss.detach())
            out["entropy_sum"] += float(torch.where(m > 0, ent, 0.0).sum())
            out["loss_finite"] &= bool(torch.isfinite(loss))
            out["logprobs_finite"] &= bool(masked_finite(lp.detach(), m))
        out["total"] = float(total)
        return out

    def _update(self, req: Update) -> dict:
        """One AdamW step, or none when the gradient or the completion tokens' entropies are not finite:
        the step is skipped, and what was not finite diagnosed (the forward's outputs, the first
        parameters whose gradient is not finite, whether the gradient computed without autocast is
        finite: a bf16 effect or not)."""
        s = self.settings
        self.policy.model.train()
        adv = req.adv.reshape(-1).to(self.policy.device)
        b = self._backward(req.ro, adv, req.sign)
        grad_norm = torch.nn.utils.clip_grad_norm_(self.policy.model.parameters(), s.grad_clip)
        out = {
            "loss": b["loss"],
            "entropy": b["entropy_sum"] / b["total"],
            "grad_norm": float(grad_norm),
            "update_skipped": 0,
        }
        if self.controller.needs_entropy:
            out["token_adv_abs_mean"] = b["tok_adv_sum"] / b["total"]
        if torch.isfinite(grad_norm) and b["entropy_finite"]:
            self.optimizer.step()
            return out
        bad = [
            n
            for n, p in self.policy.model.named_parameters()
            if p.grad is not None and not torch.isfinite(p.grad).all()
        ]
        diag = diagnosis(b["loss_finite"], b["logprobs_finite"], b["entropy_finite"], bad)
        if self.policy.dtype != torch.float32:
            fp32 = self._backward(req.ro, adv, req.sign, autocast=False)
            norm = torch.nn.utils.clip_grad_norm_(self.policy.model.parameters(), float("inf"))
            diag.update(fp32_grad_finite=bool(torch.isfinite(norm)), fp32_loss_finite=fp32["loss_finite"])
        self.optimizer.zero_grad(set_to_none=True)
        return {**out, "update_skipped": 1, "diagnosis": diag}


def training_attention_mask(attn: torch.Tensor, implementation: str = "sdpa") -> torch.Tensor:
    """The training forward's 4D attention mask ``[B, 1, L, L]`` from the 2D one ``[B, L]``, by the one
    rule of both engines (``objective.causal_mask``: a left-padding query sees every key). SDPA takes a
    boolean mask and eager an additive one; other kernels (flash-attention, flex) drop the padding
    themselves and keep ``attn``."""
    if implementation not in ("sdpa", "eager"):
        return attn
    mask = causal_mask(attn.bool(), attn.shape[1])
    if implementation == "sdpa":
        return mask
    return torch.zeros(mask.shape, device=attn.device).masked_fill(~mask, torch.finfo(torch.float32).min)
