"""The stacked engine's model half (``study/stacked.py``), on the CPU in fp32: K runs' logits equal
transformers' for each run (Qwen2 with q/k/v biases, Llama with grouped-query attention), generation
with the KV cache equals the full forward and does not depend on the batch's other runs, and the
stacked AdamW equals K torch AdamW optimizers with per-run clipping and skips."""

from __future__ import annotations

import pytest
import torch

from avspo_openrlhf.study import stacked

transformers = pytest.importorskip("transformers")


def _models(kind: str, k: int):
    torch.manual_seed(0)
    if kind == "qwen2":
        cfg = transformers.Qwen2Config(
            vocab_size=97,
            hidden_size=64,
            intermediate_size=96,
            num_hidden_layers=2,
            num_attention_heads=4,
            num_key_value_heads=2,
            tie_word_embeddings=True,
            max_position_embeddings=128,
        )
        cls = transformers.Qwen2ForCausalLM
    else:  # SmolLM2's shape in small: GQA 3:1, head_dim given, rope theta 1e5, tied
        cfg = transformers.LlamaConfig(
            vocab_size=97,
            hidden_size=48,
            intermediate_size=80,
            num_hidden_layers=2,
            num_attention_heads=3,
            num_key_value_heads=1,
            head_dim=16,
            tie_word_embeddings=kind == "llama",
            max_position_embeddings=128,
            rope_parameters={"rope_theta": 100000.0, "rope_type": "default"},
        )
        cls = transformers.LlamaForCausalLM
    models = [cls(cfg).eval() for _ in range(k)]  # K runs: K different weights
    return cfg, models


def test_a_model_the_engine_does_not_compute_is_refused_naming_why():
    cfg, _ = _models("qwen2", 1)
    stacked.StackedConfig.from_hf(cfg)
    base = {k: v for k, v in cfg.to_dict().items() if k != "layer_types"}  # derived from the rest
    sliding = {"use_sliding_window": True, "sliding_window": 8, "max_window_layers": 1}  # layer 2 of 2
    for change, why in [(sliding, "sliding window"), ({"hidden_act": "gelu"}, "SwiGLU")]:
        with pytest.raises(ValueError, match=why):
            stacked.StackedConfig.from_hf(type(cfg)(**{**base, **change}))
    # which configs have a window: Qwen2's switch and its layers, Llama none
    assert stacked.sliding_window(type(cfg)(**{**base, **sliding})) == 8
    assert stacked.sliding_window(type(cfg)(**{**base, **sliding, "max_window_layers": 2})) is None
    assert stacked.sliding_window(cfg) is None and stacked.sliding_window(_models("llama", 1)[0]) is None


def test_a_llama_with_biases_the_forward_lacks_is_refused_naming_the_field():
    llama, _ = _models("llama", 1)
    base = llama.to_dict()
    assert not stacked.StackedConfig.from_hf(llama).qkv_bias
    # attention_bias gives o_proj a bias too (q/k/v biases alone are Qwen2's, and computed)
    for field in ("mlp_bias", "attention_bias"):
        with pytest.raises(ValueError, match=f"config.{field}=True"):
            stacked.StackedConfig.from_hf(transformers.LlamaConfig(**{**base, field: True}))
    # a parameter the forward does not read is named (the engine refuses such a model); a tied
    # lm_head is the embedding, read
    qwen, (model,) = _models("qwen2", 1)
    scfg = stacked.StackedConfig.from_hf(qwen)
    names = [*model.state_dict(), "model.layers.0.self_attn.o_proj.bias"]
    assert "lm_head.weight" in names and stacked.unread_params(names, scfg) == ["model.layers.0.self_attn.o_proj.bias"]


def test_a_draw_never_takes_a_token_of_probability_zero():
    """Inverse-CDF draws at the ends of [0, 1): u = 0 takes the first token of positive probability
    (not token 0 at probability 0), u at or next to 1 (u x total rounding up to the total) the last."""
    logits = torch.tensor([[float("-inf"), 0.3, -1.0, 2.0, float("-inf"), float("-inf")]]).expand(4, 6)
    u = torch.tensor([0.0, 0.5, torch.nextafter(torch.tensor(1.0), torch.tensor(0.0)), 1.0])
    for temperature in (0.7, 1.0):
        tok = stacked.draw_tokens(logits, u, temperature)
        assert tok.tolist()[0] == 1 and tok.tolist()[2:] == [3, 3], (temperature, tok)
    assert stacked.draw_tokens(logits, u, 0.0).tolist() == [3] * 4  # greedy: the argmax, u unread
    # the draws follow softmax(logits / T): the empirical frequencies over many uniforms
    probs = torch.softmax(logits[0] / 0.7, -1)
    counts = torch.bincount(stacked.draw_tokens(logits[:1].expand(20000, 6), torch.rand(20000), 0.7), minlength=6)
    assert torch.allclose(counts / 20000, probs, atol=0.015)


def _batch(k: int, b: int, length: int, vocab: int, seed: int = 1):
    g = torch.Generator().manual_seed(seed)
    ids = torch.randint(3, vocab, (k, b, length), generator=g)
    attn = torch.ones(k, b, length, dtype=torch.long)
    for i in range(b):  # left padding of a different width per row
        attn[:, i, : i % 3] = 0
    return ids, attn, (attn.cumsum(-1) - 1).clamp_min(0)


@pytest.mark.parametrize("kind", ["qwen2", "llama", "llama-untied"])
def test_k_runs_logits_equal_transformers_for_each_run(kind):
    cfg, models = _models(kind, 3)
    scfg = stacked.StackedConfig.from_hf(cfg)
    params = stacked.stack([m.state_dict() for m in models], scfg)
    ids, attn, pos = _batch(3, 4, 9, cfg.vocab_size)
    with torch.no_grad():
        ours = stacked.forward(params, scfg, ids, attn, pos)
        for k, m in enumerate(models):
            ref = m(input_ids=ids[k], attention_mask=attn[k], position_ids=pos[k]).logits
            real = attn[k].bool()
            assert torch.allclose(ours[k][real], ref[real], atol=2e-5), (kind, k)
    # logits of the last positions only (a completion's, in training)
    with torch.no_grad():
        tail = stacked.forward(params, scfg, ids, attn, pos, keep=4)
    assert torch.allclose(tail, ours[:, :, -4:], atol=1e-6)
    # a run's checkpoint is its transformers state dict
    sd = stacked.unstack(params, 1)
    for name, t in models[1].state_dict().items():
        assert torch.equal(sd[name], t), name


def test_gradients_flow_to_each_run_alone():
    cfg, models = _models("qwen2", 2)
    scfg = stacked.StackedConfig.from_hf(cfg)
    params = stacked.stack([m.state_dict() for m in models], scfg)
    ids, attn, pos = _batch(2, 3, 7, cfg.vocab_size)
    logits = stacked.forward(params, scfg, ids, attn, pos)
    logits[0].logsumexp(-1).sum().backward()  # a loss of run 0 only
    emb = params["model.embed_tokens.weight"].grad
    assert emb[0].abs().sum() > 0 and emb[1].abs().sum() == 0
    # and equal to transformers' gradient of the same loss
    ref = models[0](input_ids=ids[0], attention_mask=attn[0], position_ids=pos[0]).logits
    ref.logsumexp(-1)[attn[0].bool()].sum().backward()
    # padded positions' logits are not the same function in both (never read): compare on real ones
    params2 = stacked.stack([m.state_dict() for m in models], scfg)
    out = stacked.forward(params2, scfg, ids, attn, pos)
    out[0].logsumexp(-1)[attn[0].bool()].sum().backward()
    assert torch.allclose(
        params2["model.embed_tokens.weight"].grad[0], models[0].model.embed_tokens.weight.grad, atol=1e-4
    )


def _generate(params, scfg, ids, attn, u, eos):
    return stacked.generate(params, scfg, ids, attn, u, 0.7, eos, pad_id=0)


def test_generation_with_the_cache_equals_the_full_forward_and_ignores_the_other_runs():
    cfg, models = _models("llama", 3)
    scfg = stacked.StackedConfig.from_hf(cfg)
    params = stacked.stack([m.state_dict() for m in models], scfg)
    ids, attn, _ = _batch(3, 4, 6, cfg.vocab_size)
    gens = [torch.Generator().manual_seed(100 + k) for k in range(3)]
    u = stacked.per_run_uniforms(gens, (4, 8))
    eos = torch.tensor([1])
    out = _generate(params, scfg, ids, attn, u, eos)
    T = out.shape[-1]
    # the same draws without the cache: the whole sequence through the forward at every step
    with torch.no_grad():
        seq, a = ids.clone(), attn.clone()
        for t in range(T):
            pos = (a.cumsum(-1) - 1).clamp_min(0)
            logits = stacked.forward(params, scfg, seq, a, pos, keep=1)[:, :, -1]
            cdf = torch.softmax(logits / 0.7, -1).cumsum(-1)
            tok = torch.searchsorted(cdf, (u[..., t] * cdf[..., -1])[..., None], right=True).squeeze(-1)
            ended = (
                torch.isin(seq[:, :, ids.shape[-1] :], eos).any(-1) if t else torch.zeros_like(tok, dtype=torch.bool)
            )
            tok = torch.where(ended, torch.zeros_like(tok), tok)
            assert torch.equal(tok, out[:, :, t]), t
            seq, a = torch.cat([seq, tok[..., None]], -1), torch.cat([a, torch.ones_like(tok)[..., None]], -1)
    # run 1 alone, or beside other companions: the same tokens (its own weights, its own random numbers)
    alone = _generate({n: p[1:2] for n, p in params.items()}, scfg, ids[1:2], attn[1:2], u[1:2], eos)
    assert torch.equal(alone[0], out[1, :, : alone.shape[-1]])
    others = [models[2], models[1], models[0]]
    swapped = stacked.stack([m.state_dict() for m in others], scfg)
    order = torch.tensor([2, 1, 0])
    again = _generate(swapped, scfg, ids[order], attn[order], u[order], eos)
    assert torch.equal(again[1, :, : alone.shape[-1]], alone[0])


def test_stacked_adamw_equals_k_torch_optimizers_with_per_run_clipping_and_skips():
    torch.manual_seed(0)
    k = 3
    weights = {"a": torch.randn(k, 5, 4), "b": torch.randn(k, 7)}
    lrs = torch.tensor([1e-2, 3e-3, 1e-3])
    params = {n: w.clone().requires_grad_(True) for n, w in weights.items()}
    opt = stacked.StackedAdamW(params, lrs, betas=(0.9, 0.95))
    refs = [{n: w[i].clone().requires_grad_(True) for n, w in weights.items()} for i in range(k)]
    ref_opts = [
        torch.optim.AdamW(list(r.values()), lr=float(lrs[i]), betas=(0.9, 0.95), weight_decay=0.0, foreach=False)
        for i, r in enumerate(refs)
    ]
    for step in range(4):
        grads = {n: torch.randn_like(w) * (10.0 if step == 1 else 0.1) for n, w in weights.items()}
        if step == 2:
            grads["a"][1, 0, 0] = float("nan")  # run 1's gradient is not finite: it skips this step alone
        for n in params:
            params[n].grad = grads[n].clone()
        norms, stepped = opt.step(max_norm=1.0)
        assert stepped.tolist() == [True, step != 2, True]
        for i in range(k):
            if step == 2 and i == 1:
                continue
            for n in refs[i]:
                refs[i][n].grad = grads[n][i].clone()
            norm = torch.nn.utils.clip_grad_norm_(list(refs[i].values()), 1.0)
            assert float(norm) == pytest.approx(float(norms[i]), rel=1e-5)
            ref_opts[i].step()
        for i in range(k):
            for n in params:
                assert torch.allclose(params[n][i], refs[i][n], atol=1e-6), (step, i, n)
    state = opt.state_of(1)
    assert state["step"] == 3.0  # one skipped of four
