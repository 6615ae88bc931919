"""K runs of one small causal LM advanced together: their weights stacked along a leading run axis,
every matmul one batched matmul over the runs (issue 59's engine, its model half).

A study's runs share an architecture and differ in their weights; run one process each and a GPU
is kept busy by many small kernels taking turns (a dozen SmolLM2-135M runs saturate an H200 at a
fraction of its arithmetic). Here one forward computes all K: ``[K, B, L]`` token ids against weights
``[K, ...]``, with ``torch.bmm`` over the run axis, one SDPA call over the ``K * B`` sequences, and a
static KV cache for generation. The forward is a compact Llama/Qwen2 (RMSNorm, rotary positions,
grouped-query attention, SwiGLU; Qwen2's q/k/v biases; tied or separate output embedding), checked
against transformers' logits in ``tests/test_stacked.py``.

What is per run stays per run: weights and optimizer moments (:class:`StackedAdamW`: per-run learning
rate, step count, gradient-norm clipping and skip), and the sampling random numbers
(:func:`generate` takes each run's uniforms, drawn from that run's own generator), so a run samples
the same tokens whatever runs share its batch.
"""

from __future__ import annotations

import contextlib
from dataclasses import dataclass

import torch
import torch.nn.functional as F

from avspo_openrlhf.study.objective import causal_mask


def sliding_window(config) -> int | None:
    """The attention window a transformers config applies in some layer; None where every layer's
    attention is full causal (Llama; Qwen2 unless ``use_sliding_window`` and ``layer_types`` say so)."""
    window = getattr(config, "sliding_window", None)
    types = getattr(config, "layer_types", None)
    if types is not None:
        return window if any(t != "full_attention" for t in types) else None
    return window if getattr(config, "use_sliding_window", window is not None) else None


@dataclass(frozen=True)
class StackedConfig:
    """The architecture the runs share (read from a transformers config)."""

    vocab: int
    hidden: int
    layers: int
    heads: int
    kv_heads: int
    head_dim: int
    intermediate: int
    eps: float
    rope_theta: float
    qkv_bias: bool
    tied: bool
    # the embedding row transformers gives no gradient (nn.Embedding's padding_idx = config.pad_token_id): a
    # real token can carry that id (SmolLM2's pad is its EOS, <|im_end|>, in every chat prompt)
    padding_idx: int | None = None

    @classmethod
    def from_hf(cls, config) -> StackedConfig:
        if config.model_type not in ("llama", "qwen2"):
            raise ValueError(f"the stacked engine runs Llama and Qwen2 models, not {config.model_type!r}")
        if sliding_window(config) is not None:
            raise ValueError("the stacked engine's attention is full causal: this model uses a sliding window")
        if getattr(config, "hidden_act", "silu") != "silu":
            raise ValueError(f"the stacked engine's MLP is SwiGLU (silu), got {config.hidden_act!r}")
        rope = getattr(config, "rope_parameters", None) or {}
        if rope.get("rope_type", "default") != "default":
            raise ValueError(
                f"the stacked engine's rotary positions are the default ones, got {rope.get('rope_type')!r}"
            )
        theta = rope.get("rope_theta", getattr(config, "rope_theta", 10000.0))
        head_dim = getattr(config, "head_dim", None) or config.hidden_size // config.num_attention_heads
        # Llama's biases: attention_bias gives o_proj one too, which the forward lacks (Qwen2's q/k/v
        # biases are computed); refused rather than silently dropped
        for field, part in (("attention_bias", "an o_proj bias"), ("mlp_bias", "MLP biases")):
            if getattr(config, field, False):
                raise ValueError(f"the stacked engine's forward has no {part}: this model sets config.{field}=True")
        if config.num_attention_heads % config.num_key_value_heads:
            raise ValueError(
                f"{config.num_attention_heads} heads are not a multiple of {config.num_key_value_heads} kv heads"
            )
        return cls(
            vocab=config.vocab_size,
            hidden=config.hidden_size,
            layers=config.num_hidden_layers,
            heads=config.num_attention_heads,
            kv_heads=config.num_key_value_heads,
            head_dim=head_dim,
            intermediate=config.intermediate_size,
            eps=float(config.rms_norm_eps),
            rope_theta=float(theta),
            qkv_bias=config.model_type == "qwen2",
            tied=bool(config.tie_word_embeddings),
            padding_idx=getattr(config, "pad_token_id", None),
        )


def param_names(cfg: StackedConfig) -> list[str]:
    """The transformers state-dict names the engine reads, in a fixed order."""
    names = ["model.embed_tokens.weight"]
    for i in range(cfg.layers):
        p = f"model.layers.{i}."
        names += [
            p + "input_layernorm.weight",
            p + "self_attn.q_proj.weight",
            p + "self_attn.k_proj.weight",
            p + "self_attn.v_proj.weight",
            p + "self_attn.o_proj.weight",
            p + "post_attention_layernorm.weight",
            p + "mlp.gate_proj.weight",
            p + "mlp.up_proj.weight",
            p + "mlp.down_proj.weight",
        ]
        if cfg.qkv_bias:
            names += [p + "self_attn.q_proj.bias", p + "self_attn.k_proj.bias", p + "self_attn.v_proj.bias"]
    names.append("model.norm.weight")
    if not cfg.tied:
        names.append("lm_head.weight")
    return names


def unread_params(names, cfg: StackedConfig) -> list[str]:
    """The parameters among ``names`` (a model's, buffers left out) the forward does not read: a part
    of the model it would silently drop. A tied model's ``lm_head.weight`` is the embedding it reads."""
    read = set(param_names(cfg)) | ({"lm_head.weight"} if cfg.tied else set())
    return [n for n in names if n not in read]


def stack(state_dicts: list[dict[str, torch.Tensor]], cfg: StackedConfig, device=None) -> dict[str, torch.Tensor]:
    """``{name: [K, ...]}`` fp32 leaf tensors (the optimizer's master copy) from K runs' state dicts."""
    return {
        n: torch.stack([sd[n].float() for sd in state_dicts]).to(device).requires_grad_(True) for n in param_names(cfg)
    }


def unstack(params: dict[str, torch.Tensor], k: int) -> dict[str, torch.Tensor]:
    """Run ``k``'s weights as a transformers state dict (a checkpoint of one run)."""
    sd = {n: p[k].detach().clone() for n, p in params.items()}
    if "lm_head.weight" not in sd:
        sd["lm_head.weight"] = sd["model.embed_tokens.weight"]
    return sd


def _linear(x: torch.Tensor, w: torch.Tensor, b: torch.Tensor | None = None) -> torch.Tensor:
    """``x [K, ..., in] @ w[k].T (+ b[k])`` for every run k: one batched matmul."""
    shape = x.shape
    y = torch.bmm(x.reshape(shape[0], -1, shape[-1]), w.transpose(1, 2))
    if b is not None:
        y = y + b[:, None, :]
    return y.reshape(*shape[:-1], w.shape[1])


def _rms_norm(x: torch.Tensor, w: torch.Tensor, eps: float) -> torch.Tensor:
    """transformers' LlamaRMSNorm: in fp32, then back to the input's dtype, times the weight."""
    dtype = x.dtype
    h = x.float()
    h = h * torch.rsqrt(h.pow(2).mean(-1, keepdim=True) + eps)
    return w.view(w.shape[0], *([1] * (x.dim() - 2)), w.shape[-1]) * h.to(dtype)


def _rope(pos: torch.Tensor, cfg: StackedConfig, dtype: torch.dtype) -> tuple[torch.Tensor, torch.Tensor]:
    """cos, sin ``[..., head_dim]`` of the default rotary embedding at positions ``pos``."""
    inv = 1.0 / (
        cfg.rope_theta ** (torch.arange(0, cfg.head_dim, 2, device=pos.device, dtype=torch.float32) / cfg.head_dim)
    )
    freqs = pos.float()[..., None] * inv
    emb = torch.cat([freqs, freqs], -1)
    return emb.cos().to(dtype), emb.sin().to(dtype)


def _rotate(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
    half = x.shape[-1] // 2
    rotated = torch.cat([-x[..., half:], x[..., :half]], -1)
    return x * cos + rotated * sin


class KVCache:
    """A static cache: ``[layers]`` of keys and values ``[K * B, kv_heads, S, head_dim]`` and the
    attention mask of the cached positions ``[K * B, S]``."""

    def __init__(self, cfg: StackedConfig, n: int, size: int, device, dtype):
        shape = (n, cfg.kv_heads, size, cfg.head_dim)
        self.k = [torch.zeros(shape, device=device, dtype=dtype) for _ in range(cfg.layers)]
        self.v = [torch.zeros(shape, device=device, dtype=dtype) for _ in range(cfg.layers)]
        self.valid = torch.zeros(n, size, dtype=torch.bool, device=device)
        self.length = 0


def forward(
    params: dict[str, torch.Tensor],
    cfg: StackedConfig,
    ids: torch.Tensor,
    attn: torch.Tensor,
    pos: torch.Tensor,
    keep: int | None = None,
    cache: KVCache | None = None,
) -> torch.Tensor:
    """Logits ``[K, B, keep or L, V]`` (fp32) of ``ids`` ``[K, B, L]`` under each run's weights.

    ``attn`` ``[K, B, L]``: 1 for a real token, 0 for padding; ``pos`` its position ids. ``keep``: the
    last ``keep`` positions only get logits (the completion's, in training). With ``cache``, the L
    tokens are appended to it (prefill, then one token a decode step) and attend to what it holds."""
    K, B, L = ids.shape
    n = K * B
    emb = params["model.embed_tokens.weight"]
    x = emb[torch.arange(K, device=ids.device)[:, None, None], ids]  # [K, B, L, D]
    if cfg.padding_idx is not None:  # as transformers' embedding: no gradient to the padding row
        x = torch.where((ids == cfg.padding_idx)[..., None], x.detach(), x)
    dtype = torch.get_autocast_dtype(x.device.type) if torch.is_autocast_enabled(x.device.type) else x.dtype
    cos, sin = _rope(pos.reshape(n, L), cfg, dtype)
    cos, sin = cos[:, None], sin[:, None]  # [n, 1, L, hd]
    valid = attn.reshape(n, L).bool()
    if cache is None:
        keys_valid, start = valid, 0
    else:
        start = cache.length
        cache.valid[:, start : start + L] = valid
        keys_valid = cache.valid[:, : start + L]
    mask = causal_mask(keys_valid, L, start)  # [n, 1, L, S]: a left pad's query sees every key
    rep = cfg.heads // cfg.kv_heads
    for i in range(cfg.layers):
        p = f"model.layers.{i}."
        h = _rms_norm(x, params[p + "input_layernorm.weight"], cfg.eps)
        qb, kb, vb = (params[p + f"self_attn.{x}_proj.bias"] for x in "qkv") if cfg.qkv_bias else (None,) * 3
        q = _linear(h, params[p + "self_attn.q_proj.weight"], qb)
        k = _linear(h, params[p + "self_attn.k_proj.weight"], kb)
        v = _linear(h, params[p + "self_attn.v_proj.weight"], vb)
        q = q.reshape(n, L, cfg.heads, cfg.head_dim).transpose(1, 2)
        k = k.reshape(n, L, cfg.kv_heads, cfg.head_dim).transpose(1, 2)
        v = v.reshape(n, L, cfg.kv_heads, cfg.head_dim).transpose(1, 2)
        q, k = _rotate(q, cos, sin), _rotate(k, cos, sin)
        if cache is not None:
            cache.k[i][:, :, start : start + L] = k.to(cache.k[i].dtype)
            cache.v[i][:, :, start : start + L] = v.to(cache.v[i].dtype)
            k, v = cache.k[i][:, :, : start + L].to(q.dtype), cache.v[i][:, :, : start + L].to(q.dtype)
        if rep > 1:
            k, v = k.repeat_interleave(rep, 1), v.repeat_interleave(rep, 1)
        o = F.scaled_dot_product_attention(q, k, v, attn_mask=mask)  # [n, heads, L, hd]
        o = o.transpose(1, 2).reshape(K, B, L, cfg.heads * cfg.head_dim)
        x = x + _linear(o, params[p + "self_attn.o_proj.weight"])
        h = _rms_norm(x, params[p + "post_attention_layernorm.weight"], cfg.eps)
        gate = _linear(h, params[p + "mlp.gate_proj.weight"])
        up = _linear(h, params[p + "mlp.up_proj.weight"])
        x = x + _linear(F.silu(gate) * up, params[p + "mlp.down_proj.weight"])
    if cache is not None:
        cache.length = start + L
    if keep is not None:
        x = x[:, :, -keep:]
    x = _rms_norm(x, params["model.norm.weight"], cfg.eps)
    head = params["model.embed_tokens.weight" if cfg.tied else "lm_head.weight"]
    return _linear(x, head).float()


def draw_uniforms(seed: int, rows: int, new_tokens: int) -> torch.Tensor:
    """The uniforms ``[rows, new_tokens]`` of one generation request: row b's token t is drawn with
    ``[b, t]``. Both engines draw them so, for all the request's rows in order (each problem repeated
    n times): a row's tokens depend on the seed, its index and the weights, not on how it is batched."""
    return torch.rand(rows, new_tokens, generator=torch.Generator().manual_seed(seed))


def draw_tokens(logits: torch.Tensor, u: torch.Tensor, temperature: float) -> torch.Tensor:
    """Tokens ``[...]`` from logits ``[..., V]``: the inverse-CDF draw of ``u`` ``[...]`` (in [0, 1)) from
    softmax(logits / temperature); temperature 0 is greedy (the argmax; ``u`` unread).

    The draw is the first token whose CDF exceeds u x total (searchsorted's right side), so never one
    of probability 0: its CDF equals its predecessor's (the left side drew token 0 at u = 0 whatever
    its probability). Where u x total rounds up to the total, the draw is the token at which the CDF
    reaches the total (argmax: its first index), the last one with probability mass, not one past it."""
    if temperature == 0:
        return logits.argmax(-1)
    cdf = torch.softmax(logits.float() / temperature, -1).cumsum(-1)
    v = u.to(cdf.dtype) * cdf[..., -1]
    tok = torch.searchsorted(cdf, v[..., None], right=True).squeeze(-1)
    return torch.minimum(tok, cdf.argmax(-1))


@torch.no_grad()
def generate(
    params: dict[str, torch.Tensor],
    cfg: StackedConfig,
    ids: torch.Tensor,
    attn: torch.Tensor,
    uniforms: torch.Tensor,
    temperature: float,
    eos_ids: torch.Tensor,
    pad_id: int,
    autocast_dtype: torch.dtype | None = None,
    rows: torch.Tensor | None = None,
) -> torch.Tensor:
    """Sampled completions ``[K, B, T]`` of left-padded prompts ``ids``/``attn`` ``[K, B, Lp]``, T =
    ``uniforms.shape[-1]`` new tokens at most, with a static KV cache.

    Token t of sequence (k, b) is the inverse-CDF draw of ``uniforms[k, b, t]`` from softmax(logits /
    temperature) (:func:`draw_tokens`; temperature 0: the argmax, the uniforms unread): the random
    numbers are the caller's, one run's drawn from its own generator, so a run's tokens do not depend
    on which runs share the batch. After its first EOS a sequence emits ``pad_id``; generation ends
    when every sequence has ended. ``rows`` ``[K, B]`` bool: the real sequences (False: a filler row
    of a run with fewer sequences, ended from the start)."""
    K, B, Lp = ids.shape
    T = uniforms.shape[-1]
    device = ids.device
    ctx = torch.autocast(device.type, dtype=autocast_dtype) if autocast_dtype is not None else contextlib.nullcontext()
    cache = KVCache(cfg, K * B, Lp + T, device, autocast_dtype or torch.float32)
    pos = (attn.cumsum(-1) - 1).clamp_min(0)
    out = torch.full((K, B, T), pad_id, dtype=ids.dtype, device=device)
    done = torch.zeros(K, B, dtype=torch.bool, device=device) if rows is None else ~rows.to(device)
    with ctx:
        logits = forward(params, cfg, ids, attn, pos, keep=1, cache=cache)[:, :, -1]
    next_pos = pos[:, :, -1] + 1
    for t in range(T):
        tok = draw_tokens(logits, uniforms[..., t], temperature)
        tok = torch.where(done, torch.full_like(tok, pad_id), tok)
        out[:, :, t] = tok
        done = done | torch.isin(tok, eos_ids)
        if bool(done.all()) or t == T - 1:
            return out[:, :, : t + 1]
        with ctx:
            # an ended sequence's pad is appended too (its outputs are never read): one shape for all
            logits = forward(
                params, cfg, tok[..., None], torch.ones_like(tok)[..., None], next_pos[..., None], keep=1, cache=cache
            )[:, :, -1]
        next_pos = next_pos + 1
    return out


class StackedAdamW:
    """AdamW over stacked parameters ``[K, ...]``, each run its own optimizer: its learning rate, its
    step count (bias correction), its gradient-norm clipping, and a step it may skip (a non-finite
    gradient) without touching its weights or moments. Elementwise, so it equals K torch AdamW
    optimizers (``foreach`` off) up to rounding."""

    def __init__(
        self,
        params: dict[str, torch.Tensor],
        lr: torch.Tensor,
        betas=(0.9, 0.95),
        eps: float = 1e-8,
        weight_decay: float = 0.0,
    ):
        self.params = params
        k = next(iter(params.values())).shape[0]
        self.lr = lr.to(torch.float64).reshape(k)
        self.betas, self.eps, self.wd = betas, eps, weight_decay
        self.step_count = torch.zeros(k, dtype=torch.float64)
        self.m = {n: torch.zeros_like(p, memory_format=torch.preserve_format).detach() for n, p in params.items()}
        self.v = {n: torch.zeros_like(p, memory_format=torch.preserve_format).detach() for n, p in params.items()}

    def grad_norms(self) -> torch.Tensor:
        """Each run's total gradient norm ``[K]`` (over every parameter)."""
        sq = sum(p.grad.float().pow(2).reshape(p.shape[0], -1).sum(1) for p in self.params.values())
        return sq.sqrt()

    @torch.no_grad()
    def step(self, max_norm: float, active: torch.Tensor | None = None) -> tuple[torch.Tensor, torch.Tensor]:
        """Clip each run's gradient to ``max_norm`` and step the runs in ``active`` ``[K]`` whose norm
        is finite. Returns ``(norms [K], stepped [K] bool)``."""
        norms = self.grad_norms()
        k = norms.shape[0]
        # the per-run bookkeeping lives on the CPU (the norms on the runs' device: an H200 found the mix)
        stepped = torch.isfinite(norms).cpu() & (torch.ones(k, dtype=torch.bool) if active is None else active.cpu())
        self.step_count += stepped.double()
        b1, b2 = self.betas
        coef = (max_norm / (norms + 1e-6)).clamp(max=1.0)  # torch's clip_grad_norm_
        n_t = self.step_count.clamp_min(1.0)
        first = next(iter(self.params.values()))
        # the per-run scalars, moved to the device once a step
        per_run = torch.stack([stepped.double(), coef.double().cpu(), self.lr, 1 - b1**n_t, 1 - b2**n_t])
        on_, coef_, lr_, bc1_, bc2_ = per_run.to(first.device, first.dtype)
        for name, p in self.params.items():
            shape = (k,) + (1,) * (p.dim() - 1)
            on = on_.view(shape) > 0
            g = torch.where(on, p.grad * coef_.view(shape), torch.zeros_like(p.grad))
            m, v = self.m[name], self.v[name]
            m.copy_(torch.where(on, m * b1 + g * (1 - b1), m))
            v.copy_(torch.where(on, v * b2 + g * g * (1 - b2), v))
            lr = lr_.view(shape)
            update = lr * (m / bc1_.view(shape)) / ((v / bc2_.view(shape)).sqrt() + self.eps)
            p.copy_(torch.where(on, p * (1 - lr * self.wd) - update, p))
        return norms, stepped

    def zero_grad(self) -> None:
        for p in self.params.values():
            p.grad = None

    def state_of(self, k: int) -> dict:
        """Run ``k``'s optimizer state (its moments by parameter name, its step count)."""
        return {
            "step": float(self.step_count[k]),
            "m": {n: t[k].clone() for n, t in self.m.items()},
            "v": {n: t[k].clone() for n, t in self.v.items()},
        }

    def load_state_of(self, k: int, state: dict) -> None:
        self.step_count[k] = state["step"]
        for n in self.m:
            self.m[n][k].copy_(state["m"][n])
            self.v[n][k].copy_(state["v"][n])


def per_run_uniforms(generators: list[torch.Generator], shape: tuple[int, ...], device=None) -> torch.Tensor:
    """``[K, *shape]`` uniforms, run k's from its own generator (a draw per run, not per token)."""
    return torch.stack([torch.rand(shape, generator=g) for g in generators]).to(device)
