"""The remedies study's design, made right before its runs (issue 56), on the CPU: on-policy
log-probs at the sampling temperature, controls that control, a non-finite step skipped and
counted, runs keyed by their settings, common random numbers, a held-out set disjoint from
training, evaluations at fixed token milestones, and the decision rule in code."""

from __future__ import annotations

import dataclasses
import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
import torch
from helpers import small_study

from avspo_openrlhf.algo import ACRConfig, AVSPOConfig, CollapseController, collapse_stats
from avspo_openrlhf.study import fingerprint, hf_engine, loop, objective
from avspo_openrlhf.study import spec as study_spec
from avspo_openrlhf.study.controls import format_reward, random_sign_advantages, sampling_seed
from avspo_openrlhf.study.remedies_gpu import GPURemediesStudy
from avspo_openrlhf.study.spec import Arm, RunSpec
from avspo_openrlhf.study.store import StudyError, check_pairable

pytest.importorskip("transformers")
REPO = Path(__file__).resolve().parents[1]
TESTS = Path(__file__).resolve().parent
ROOT = Path(__file__).resolve().parents[1]
SMALL = small_study(ckpt_every=0)


@pytest.fixture(scope="module")
def assets(study_assets):
    return study_assets


pytestmark = pytest.mark.usefixtures("study_rewards")


def spec(assets, arm: Arm, seed: int = 0, method: str = "arm", **settings) -> RunSpec:
    return RunSpec(
        method=method,
        seed=seed,
        arm=arm,
        settings=dataclasses.replace(SMALL, **settings),
        model=assets["model"],
        train=assets["train"],
        heldout=assets["heldout"],
    )


# ── 1. on-policy log-probs ──


def test_logprobs_and_entropies_are_those_of_the_sampling_temperature(assets, tmp_path):
    logits = torch.randn(3, 5, 11, dtype=torch.float64)
    targets = torch.randint(0, 11, (3, 5))
    for T in (0.7, 1.0, 1.5):
        lp, ent = objective.token_logprobs_entropy(logits, targets, T, True)
        ref = torch.log_softmax(logits.float() / T, -1)
        assert torch.allclose(lp, ref.gather(-1, targets[..., None]).squeeze(-1), atol=1e-6)
        assert torch.allclose(ent, -(ref.exp() * ref).sum(-1), atol=1e-6)
    # through the loop's model forward: the log-probs it trains on are log_softmax(logits / T)
    run = loop.Run(spec(assets, Arm("grpo"), final_eval=False), tmp_path / "r")
    ro = run.policy.generate(["What is 2 + 3?"], 4, 8, 0.7, 16)
    width_c = ro.mask.shape[1]
    lp, _ = run.policy.logprobs_entropy(ro.ids, ro.attn, width_c, False, 0.7)
    pos = (ro.attn.cumsum(-1) - 1).clamp_min(0)
    with torch.no_grad():
        full = run.policy.model(input_ids=ro.ids, attention_mask=ro.attn, position_ids=pos).logits[:, -width_c - 1 : -1]
    ref = torch.log_softmax(full.float() / 0.7, -1).gather(-1, ro.ids[:, -width_c:, None]).squeeze(-1)
    m = ro.mask.bool()
    assert torch.allclose(lp[m], ref[m], atol=1e-5)
    assert not torch.allclose(
        lp[m], torch.log_softmax(full.float(), -1).gather(-1, ro.ids[:, -width_c:, None]).squeeze(-1)[m], atol=1e-3
    )


def test_a_constant_advantage_on_policy_leaves_the_entropy_unchanged():
    """The expected update of a constant advantage A on samples of pi_T: exactly zero with log pi_T
    (E_pi[grad log pi] = 0); with the T = 1 log-probs after sampling at T = 0.7 it is not, and a
    negative A (an all-wrong group's push) raises the entropy of the sampling policy."""
    torch.manual_seed(0)
    T, A, lr = 0.7, -1.0, 0.5
    base = torch.randn(64, 50) * 2  # 64 positions, a vocabulary of 50

    def entropy_after(temperature_of_logprobs: float) -> tuple[float, float]:
        z = base.clone().requires_grad_(True)
        p = torch.softmax(z.detach() / T, -1)  # the sampling distribution: the exact expectation over samples
        vocab = torch.arange(50).expand(64, 50)
        lp, _ = objective.token_logprobs_entropy(
            z[:, None, :].expand(64, 50, 50), vocab, temperature_of_logprobs, False
        )
        (-(A * p * lp).sum()).backward()
        with torch.no_grad():
            after = z - lr * z.grad
            h = lambda x: float(torch.special.entr(torch.softmax(x / T, -1)).sum(-1).mean())  # noqa: E731
            return h(after) - h(base), float(z.grad.abs().max())

    change, grad = entropy_after(T)
    assert grad < 1e-5 and abs(change) < 1e-5  # on-policy: no update at all
    change, grad = entropy_after(1.0)
    assert grad > 1e-2 and change > 1e-3  # the old computation: the entropy rises


# ── 2. controls that control ──


def test_the_policy_loss_is_one_runs_mean_and_stacks_per_run():
    """The objective both engines use: - sum of A * log pi over completion tokens / the batch's token
    count; along a leading run axis each run gets its own loss; a masked position adds an exact 0
    even where its log-prob is NaN."""
    lp = torch.tensor([[-1.0, -2.0, float("nan")], [-0.5, -0.25, -4.0]], requires_grad=True)
    mask = torch.tensor([[1.0, 1.0, 0.0], [1.0, 1.0, 1.0]])
    adv = torch.tensor([[2.0, 2.0, 2.0], [-1.0, -1.0, -1.0]])
    loss = objective.policy_loss(lp, adv, mask, mask.sum())
    assert loss.item() == pytest.approx(-(2 * -1 + 2 * -2 + -1 * -0.5 + -1 * -0.25 + -1 * -4) / 5)
    loss.backward()
    assert torch.isfinite(lp.grad).all() and lp.grad[0, 2] == 0  # the NaN's position: no gradient
    assert torch.equal(lp.grad, -adv * mask / 5)
    runs = torch.stack([lp.detach(), lp.detach().flip(0)])  # [R=2, b, T]
    masks, advs = torch.stack([mask, mask.flip(0)]), torch.stack([adv, adv.flip(0)])
    per_run = objective.policy_loss(runs, advs, masks, masks.sum((1, 2)))
    assert per_run.shape == (2,) and torch.equal(per_run[0], per_run[1]) and per_run[0] == loss.detach()
    # the finiteness check reads the completion tokens only, per run along the run axis
    assert objective.masked_finite(lp.detach(), mask) and not objective.masked_finite(lp.detach(), torch.ones(2, 3))
    assert objective.masked_finite(runs, torch.stack([mask, torch.ones(2, 3)])).tolist() == [True, False]


def test_the_training_mask_opens_blind_queries_and_decoding_reads_its_last_row():
    """The attention rule of both engines: causal over real keys; a left pad's query (no key to see)
    sees every key; the mask of one new query at ``start`` is the last row of the whole sequence's."""
    valid = torch.tensor([[False, False, True, True], [True, True, True, True]])
    m = objective.causal_mask(valid, 4)[:, 0]  # [n, L, S]
    assert m[0, 0].all() and m[0, 1].all()  # the two pads' queries see every key
    assert m[0, 2].tolist() == [False, False, True, False] and m[0, 3].tolist() == [False, False, True, True]
    assert torch.equal(m[1], torch.ones(4, 4, dtype=torch.bool).tril())
    last = objective.causal_mask(valid, 1, start=3)[:, 0, 0]
    assert torch.equal(last, m[:, 3])


def test_the_random_sign_control_ignores_the_rewards():
    wrong, right = torch.zeros(2000, 8), torch.ones(2000, 8)
    for rewards in (wrong, right):
        collapsed = collapse_stats(rewards).collapsed
        adv = random_sign_advantages(torch.zeros(2000, 8), collapsed, torch.Generator().manual_seed(0))
        positive = float((adv[:, 0] > 0).float().mean())
        assert 0.45 < positive < 0.55 and set(adv.unique().tolist()) == {-1.0, 1.0}
        assert bool((adv == adv[:, :1]).all())  # one sign per group
    # the coins do not depend on the rewards: all-wrong and all-right groups draw the same signs
    a = random_sign_advantages(torch.zeros(50, 4), torch.ones(50, dtype=torch.bool), torch.Generator().manual_seed(3))
    b = random_sign_advantages(torch.zeros(50, 4), torch.ones(50, dtype=torch.bool), torch.Generator().manual_seed(3))
    assert torch.equal(a, b)
    # mixed groups keep their (GRPO) advantages
    mixed = torch.tensor([[0.0, 1.0, 0.0, 1.0]])
    adv = torch.tensor([[-1.0, 1.0, -1.0, 1.0]])
    assert torch.equal(random_sign_advantages(adv, collapse_stats(mixed).collapsed, torch.Generator()), adv)


def test_avspo_random_uniform_is_not_a_random_sign_control():
    """Its virtual values lie in the reward range: an all-wrong group is always pushed down."""
    ctrl = CollapseController("avspo", AVSPOConfig(strategy="random_uniform"), acr=ACRConfig(tau_init=0.1), seed=0)
    adv, _ = ctrl.step(torch.zeros(500, 8))
    assert bool((adv < 0).all())


def test_the_format_reward_scores_an_answer_whatever_its_value():
    assert format_reward("arith")(["so it is 41", "\\boxed{7}", "I do not know"]) == [1.0, 1.0, 0.0]
    assert format_reward("math")(["\\boxed{x+1}", "no answer here"]) == [1.0, 0.0]
    with pytest.raises(ValueError, match="format"):
        RunSpec(
            method="f",
            seed=0,
            arm=Arm("grpo", reward="format"),
            settings=dataclasses.replace(SMALL),
            model="m",
            train="t",
            heldout="h",
        )  # study_reward:parity has no answer extraction


def test_a_remedy_configs_own_seed_wins_over_the_runs():
    a = CollapseController("avspo", AVSPOConfig(strategy="random_uniform", seed=7), seed=0)
    b = CollapseController("avspo", AVSPOConfig(strategy="random_uniform", seed=7), seed=1)
    c = CollapseController("avspo", AVSPOConfig(strategy="random_uniform"), seed=7)
    assert torch.equal(a.generator.get_state(), b.generator.get_state())
    assert torch.equal(a.generator.get_state(), c.generator.get_state())


# ── 3. no seed lost ──


def test_a_non_finite_step_is_skipped_counted_and_diagnosed(assets, tmp_path):
    # 200 tokens: at least 4 steps of at most 2 x 4 x 8 = 64 generated tokens
    run = loop.Run(spec(assets, Arm("grpo"), token_budget=200, final_eval=False, mid_eval_tokens=0), tmp_path / "r")
    emb = run.policy.model.get_input_embeddings().weight

    def poison(grad):  # the second step's gradient is not finite (an overflow, a NaN in a forward)
        return torch.full_like(grad, float("nan")) if run.state["step"] == 1 else grad

    emb.register_hook(poison)
    run.train(log=lambda _: None)
    res = run.result()
    assert res["steps"] >= 3  # the run went on
    assert [c["update_skipped"] for c in res["curve"][:3]] == [0, 1, 0]
    (diag,) = res["nonfinite_steps"]
    assert diag["step"] == 2 and diag["nonfinite_grads"] >= 1 and diag["loss_finite"] and diag["logprobs_finite"]
    assert any("embed" in n for n in diag["first_nonfinite_grads"])
    assert (tmp_path / "r" / "nonfinite_step2.pt").exists()
    # AdamW stepped once per updated step, not on the skipped one
    steps = {int(s["step"]) for s in run.optimizer.state_dict()["state"].values()}
    assert steps == {res["steps"] - 1}
    assert res["nonfinite_share"] == pytest.approx(1 / res["steps"]) and res["flagged"]  # above 1 %


def test_no_query_row_of_the_training_forward_is_blind(assets, tmp_path, monkeypatch):
    """The first pilot's step-35 failure (H200, bf16): the rows with left padding attend to no key,
    and some CUDA SDPA kernels' backward gives NaN there, which 0 x NaN carries to every parameter.
    A CPU's kernel returns 0 there, so the test stands such a kernel in: NaN on a row that sees no key.
    With the 2D mask the gradient is not finite; with the loop's mask no row is blind, and the
    completion's log-probs are those of the 2D mask."""
    real = torch.nn.functional.scaled_dot_product_attention
    blind_rows = []

    def nan_where_blind(q, k, v, attn_mask=None, *args, **kwargs):
        out = real(q, k, v, attn_mask, *args, **kwargs)
        if attn_mask is None or attn_mask.dtype != torch.bool:
            return out
        blind = ~attn_mask.any(-1, keepdim=True)  # [B, 1, L, 1]
        blind_rows.append(int(blind.sum()))
        return out.masked_fill(blind, float("nan"))

    run = loop.Run(spec(assets, Arm("grpo"), final_eval=False), tmp_path / "r")
    model = run.policy.model
    assert model.config._attn_implementation == "sdpa"  # the private name the loop reads
    ro = run.policy.generate(["What is 2 + 3?", "What is 17 * 23 + 4 - 9?"], 2, 8, 0.7, 16)
    assert (ro.attn[:, 0] == 0).any()  # the shorter prompt is left-padded
    width_c, pos = ro.mask.shape[1], (ro.attn.cumsum(-1) - 1).clamp_min(0)
    with torch.no_grad():
        logits = model(input_ids=ro.ids, attention_mask=ro.attn, position_ids=pos).logits[:, -width_c - 1 : -1]
        ref, _ = objective.token_logprobs_entropy(logits, ro.ids[:, -width_c:], 0.7, False)
    monkeypatch.setattr(torch.nn.functional, "scaled_dot_product_attention", nan_where_blind)

    def grads_finite(forward) -> bool:
        model.zero_grad(set_to_none=True)
        (forward() * ro.mask).sum().backward()
        return all(torch.isfinite(p.grad).all() for p in model.parameters() if p.grad is not None)

    def with_2d_mask():
        logits = model(input_ids=ro.ids, attention_mask=ro.attn, position_ids=pos).logits[:, -width_c - 1 : -1]
        return objective.token_logprobs_entropy(logits, ro.ids[:, -width_c:], 0.7, False)[0]

    assert not grads_finite(with_2d_mask) and sum(blind_rows) > 0
    blind_rows.clear()
    lp = run.policy.logprobs_entropy(ro.ids, ro.attn, width_c, False, 0.7)[0]
    assert grads_finite(lambda: run.policy.logprobs_entropy(ro.ids, ro.attn, width_c, False, 0.7)[0])
    assert blind_rows and sum(blind_rows) == 0
    m = ro.mask.bool()
    assert torch.allclose(lp[m], ref[m], atol=1e-6)
    # eager attention takes the same mask as an additive one
    eager = hf_engine.training_attention_mask(ro.attn, "eager")
    assert eager.dtype == torch.float32 and torch.equal(eager == 0, hf_engine.training_attention_mask(ro.attn))
    assert hf_engine.training_attention_mask(ro.attn, "flash_attention_2") is ro.attn
    # a model whose sliding window is shorter than the batch: refused, not trained on a full causal mask
    full = model.config.layer_types
    model.config.layer_types = ["sliding_attention"] * len(full)
    model.config.sliding_window = ro.ids.shape[1] - 1
    with pytest.raises(ValueError, match="longer than the model's sliding window"):
        run.policy.logprobs_entropy(ro.ids, ro.attn, width_c, False, 0.7)
    model.config.layer_types = full


# ── 4. runs keyed by what they ran ──


def test_runs_of_another_budget_are_refused_as_a_pair_naming_the_field(assets, tmp_path):
    a = loop.run(
        spec(assets, Arm("grpo"), method="GRPO", token_budget=40, mid_eval_tokens=0), tmp_path / "a", log=lambda _: None
    )
    b = loop.run(
        spec(assets, Arm("avspo"), method="AVSPO", token_budget=80, mid_eval_tokens=0),
        tmp_path / "b",
        log=lambda _: None,
    )
    assert a["settings_hash"] != b["settings_hash"]
    with pytest.raises(StudyError, match=r"settings\.token_budget: 40 vs 80|settings\.token_budget: 80 vs 40"):
        check_pairable([a, b])
    # the same settings under another arm and seed: one hash
    c = loop.run(
        spec(assets, Arm("sign"), seed=3, method="sign", token_budget=40, mid_eval_tokens=0),
        tmp_path / "c",
        log=lambda _: None,
    )
    assert c["settings_hash"] == a["settings_hash"] and check_pairable([a, c]) == a["settings"]
    parts = {"semantics", "model", "tokenizer", "prompts", "train", "heldout", "versions", "device_kind", "precision"}
    assert parts <= set(a["settings"]) and a["commit"] and a["code"] and "code" not in a["settings"]
    assert "micro_batch" not in a["settings"]["settings"]  # speed, not semantics


def _record(assets, **paths) -> dict:
    return dataclasses.replace(spec(assets, Arm("grpo")), **paths).settings_record()


@pytest.mark.slow
def test_a_docstring_edit_of_the_algorithm_keeps_the_settings_hash(assets, tmp_path):
    """The study spans GPU sessions from one frozen commit: a docstring or a refactor of ``algo/`` must
    not unpair its runs (the loop's meaning is ``LOOP_SEMANTICS``, bumped by hand)."""
    copy = tmp_path / "copy"
    shutil.copytree(REPO / "avspo_openrlhf", copy / "avspo_openrlhf", ignore=shutil.ignore_patterns("__pycache__"))
    edited = copy / "avspo_openrlhf" / "algo" / "advantages.py"
    edited.write_text(edited.read_text().replace('"""', '"""One more docstring line.\n', 1))
    (tmp_path / "spec.json").write_text(spec(assets, Arm("grpo")).to_json())
    code = (
        "import sys, avspo_openrlhf; from avspo_openrlhf.study.spec import RunSpec; "
        "from avspo_openrlhf.study.fingerprint import settings_hash, code_fingerprint; "
        "s = RunSpec.from_json(open(sys.argv[1]).read()); "
        "print(avspo_openrlhf.__file__, settings_hash(s.settings_record()), code_fingerprint())"
    )
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(copy), str(TESTS)])}
    out = subprocess.run(  # run from tmp_path: python -c puts its cwd, the checkout, before PYTHONPATH
        [sys.executable, "-c", code, "spec.json"], cwd=tmp_path, env=env, capture_output=True, text=True, timeout=300
    )
    assert out.returncode == 0, out.stderr[-3000:]
    where, hash_, code_hash = out.stdout.split()[-3:]
    assert where.startswith(str(copy)) and code_hash != fingerprint.code_fingerprint()  # the copy ran, edited
    assert hash_ == fingerprint.settings_hash(_record(assets))


def test_a_resaved_model_config_keeps_the_settings_hash_and_a_new_system_prompt_changes_it(assets, tmp_path):
    """A config re-saved by another transformers (its ``transformers_version``) computes the same; a
    chat template with a system prompt renders other prompts: the difference names them."""
    base = _record(assets)
    resaved = Path(shutil.copytree(assets["model"], tmp_path / "resaved"))
    for name in ("config.json", "generation_config.json"):
        cfg = json.loads((resaved / name).read_text())
        (resaved / name).write_text(json.dumps({**cfg, "transformers_version": "9.9.9"}, indent=2))
    assert fingerprint.settings_hash(_record(assets, model=str(resaved))) == fingerprint.settings_hash(base)
    system = Path(shutil.copytree(assets["model"], tmp_path / "system"))
    template = system / "chat_template.jinja"
    template.write_text("<|im_start|>system\nYou are a careful solver.<|im_end|>\n" + template.read_text())
    other = _record(assets, model=str(system))
    assert fingerprint.settings_hash(other) != fingerprint.settings_hash(base)
    assert [d.split(":")[0] for d in fingerprint.settings_difference(base, other)] == ["prompts", "tokenizer"]


def test_another_loop_semantics_changes_the_settings_hash(assets, monkeypatch):
    base = _record(assets)
    monkeypatch.setattr(study_spec, "LOOP_SEMANTICS", study_spec.LOOP_SEMANTICS + 1)
    bumped = _record(assets)
    assert fingerprint.settings_hash(bumped) != fingerprint.settings_hash(base)
    assert fingerprint.settings_difference(base, bumped) == [
        f"semantics: {study_spec.LOOP_SEMANTICS - 1} vs {study_spec.LOOP_SEMANTICS}"
    ]


# ── 5. common random numbers ──


def test_two_arms_with_one_seed_draw_the_same_sampling_numbers_at_every_step(assets, tmp_path, monkeypatch):
    """GRPO, AVSPO and DAPO-DS (whose refill rounds draw more numbers in a step) start every step's
    first generation round from the same random state; with the same weights, the same tokens."""
    drawn: dict[str, dict[int, torch.Tensor]] = {}
    ids: dict[str, torch.Tensor] = {}
    real_rollout, real_generate = loop.Run._rollout_g, hf_engine.Policy.generate
    where = {}

    def rollout(self):
        where["step"], where["round"] = self.state["step"], 0
        return real_rollout(self)

    def generate(self, problems, n, *a, **k):
        if n == 4 and "step" in where:  # a training rollout (evaluations sample n = 2)
            if where["round"] == 0:
                drawn[where["arm"]][where["step"]] = torch.get_rng_state().clone()
            where["round"] += 1
        ro = real_generate(self, problems, n, *a, **k)
        if n == 4 and where.get("step") == 0 and where["round"] == 1:
            ids[where["arm"]] = ro.ids.clone()
        return ro

    monkeypatch.setattr(loop.Run, "_rollout_g", rollout)
    monkeypatch.setattr(hf_engine.Policy, "generate", generate)
    for name, arm in (("GRPO", Arm("grpo")), ("AVSPO", Arm("avspo")), ("DAPO-DS", Arm("grpo", dynamic=True))):
        where.clear()
        where["arm"], drawn[name] = name, {}
        res = loop.run(
            spec(
                assets,
                arm,
                seed=5,
                method=name,
                final_eval=False,
                mid_eval_tokens=0,
                token_budget=300,
                reward="study_reward:half_collapsed",
            ),
            tmp_path / name,
            log=lambda _: None,
        )
        if name == "DAPO-DS":
            assert any(c["rounds"] > 1 for c in res["curve"])  # it refilled: more numbers drawn in a step
    steps = set(drawn["GRPO"]) & set(drawn["AVSPO"]) & set(drawn["DAPO-DS"])
    assert len(steps) >= 2  # DAPO-DS's steps generate up to 4 rounds: 300 tokens last 2 of them at least
    for step in steps:
        assert torch.equal(drawn["GRPO"][step], drawn["AVSPO"][step])
        assert torch.equal(drawn["GRPO"][step], drawn["DAPO-DS"][step])
    assert torch.equal(ids["GRPO"], ids["AVSPO"])  # same weights, same numbers: same tokens
    assert sampling_seed(5, 1, 0) != sampling_seed(5, 2, 0) != sampling_seed(5, 1, 1)


# ── 6. held-out disjoint from training ──


def test_no_heldout_or_validation_problem_is_a_training_prompt(tmp_path):
    st = GPURemediesStudy(
        levels=("add1", "mul1", "add2"),
        train_prompts=48,
        heldout_per_level=300,
        validation_per_level=20,
        settings=SMALL,
        arms={"GRPO": Arm("grpo")},
        seeds={"GRPO": 1},
        primary=("GRPO",),
        second_base="GRPO",
    )
    train, heldout, validation = ([json.loads(x) for x in open(p)] for p in st.make_data(tmp_path))
    t = {r["problem"] for r in train}
    h, v = [r["problem"] for r in heldout], [r["problem"] for r in validation]
    assert not (t & set(h)) and not (t & set(v)) and not (set(h) & set(v))
    assert len(set(h)) == len(h) and len(set(v)) == len(v)  # distinct
    per = {lv: sum(r["level"] == lv for r in heldout) for lv in st.levels}
    assert per["add2"] == 300 and 0 < per["mul1"] < 64 and 0 < per["add1"] < 100  # all the small levels have
    assert [r["level"] for r in heldout[:3]] == ["add1", "mul1", "add2"]  # interleaved: the mid-run subset holds each
    assert all(r["unique_id"] == f"heldout/{r['level']}/{r['unique_id'].rsplit('/', 1)[1]}" for r in heldout)


# ── 7. a fair clock ──


def test_mid_run_evaluations_fall_at_the_same_token_milestones_in_every_arm(assets, tmp_path):
    got = {}
    for name, arm in (("GRPO", Arm("grpo")), ("DAPO-DS", Arm("grpo", dynamic=True))):
        r = loop.run(
            spec(assets, arm, method=name, final_eval=False, reward="study_reward:half_collapsed", token_budget=200),
            tmp_path / name,
            log=lambda _: None,
        )
        got[name] = [e["milestone"] for e in r["mid_evals"]]
        assert all(e["tokens"] >= e["milestone"] for e in r["mid_evals"])
    assert got["GRPO"] == got["DAPO-DS"] == [0, 40, 80, 120, 160, 200]


# ── 8. the decision rule in code ──


def _fake(method, seed, acc, hash_="h"):
    per = {f"heldout/add1/{i}": acc for i in range(4)}
    return {
        "method": method,
        "seed": seed,
        "per_problem": per,
        "eval_n": 4,
        "heldout_pass1": acc,
        "heldout_by_level": {"add1": acc},
        "steps": 10,
        "generated_tokens": 100,
        "signal_groups_per_mtok": 1.0,
        "acr_generated": 0.5,
        "acr_effective": 0.1,
        "truncation_rate": 0.0,
        "completion_tokens_mean": 9.0,
        "train_s": 6.0,
        "mid_evals": [],
        "device": "cpu",
        "commit": "x",
        "resumed": 0,
        "flagged": seed == 1,
        "nonfinite_steps": [{"step": 3}] if seed == 1 else [],
        "settings_hash": hash_,
        "settings": {
            "settings": dataclasses.asdict(SMALL),
            "model": "m",
            "train": "t",
            "heldout": "h",
            "plugins": [],
            "code": "c",
            "precision": "fp32",
        },
    }


@pytest.mark.slow
def test_a_partial_study_has_the_banner_and_the_whole_holm_family(tmp_path):
    arms = {a: Arm("grpo") for a in ("GRPO", "AVSPO", "sign", "RL-ZVP", "DAPO-DS")}
    st = GPURemediesStudy(
        levels=("add1",),
        train_prompts=4,
        heldout_per_level=4,
        settings=SMALL,
        arms=arms,
        seeds={a: 4 for a in arms},
        primary=tuple(arms),
    )
    runs = [_fake("GRPO", s, 0.5) for s in range(4)] + [_fake("AVSPO", s, 0.5 + 0.1 * (s + 1)) for s in range(4)]
    text = st.report(runs, tmp_path)
    assert "**Incomplete: no verdict yet.**" in text and "sign 4 of 4" in text
    decision = json.loads((tmp_path / "results.json").read_text())["decision"]
    assert set(decision["holm"]) == {"AVSPO", "sign", "RL-ZVP", "DAPO-DS"}  # the fixed family, missing ones p = 1
    assert decision["holm"]["sign"] == 1.0 and decision["holm"]["AVSPO"] == pytest.approx(min(1.0, 4 * 2 / 16))
    assert set(decision["verdicts"].values()) == {"no verdict yet"}
    assert "flagged seeds [1]" in text and "steps skipped {1: 1}" in text  # never dropped silently
    assert "What the rule can tell" in text and "detectable effect" in text
    # every primary arm complete: a verdict, and p below 0.001 printed as such
    full = runs + [
        _fake(a, s, 0.5 + (0.2 if a == "sign" else 0.0) + 0.01 * s)
        for a in ("sign", "RL-ZVP", "DAPO-DS")
        for s in range(4)
    ]
    text = st.report(full, tmp_path)
    assert "Incomplete" not in text
    decision = json.loads((tmp_path / "results.json").read_text())["decision"]
    # 4 seeds in a family of 4: the sign-flip p is at least 1/8, Holm's first level 0.0125: no verdict, said so
    assert decision["complete"] and decision["verdicts"]["RL-ZVP"].startswith("no verdict: too few seeds (4; ")
    assert "plan at least 8" in decision["verdicts"]["sign"]
    with pytest.raises(StudyError, match="differ in"):
        st.report(full + [_fake("GRPO", 9, 0.5, hash_="other")], tmp_path)


def _fake_with(method, seed, acc, **changes):
    schema = {"heldout_problems": 4, "acr_raw": 0.5, "acr_all_wrong": 0.4, "acr_all_right": 0.1, "curve": []}
    return {
        **_fake(method, seed, acc),
        **schema,
        "precision": "fp32",
        "flagged": False,
        "nonfinite_steps": [],
        **changes,
    }


def _three(seeds: int, **kw) -> GPURemediesStudy:
    """A study whose primary family is three remedies against GRPO, ``seeds`` planned seeds each."""
    arms = {a: Arm("grpo") for a in ("GRPO", "AVSPO", "sign", "RL-ZVP")}
    return GPURemediesStudy(
        levels=("add1",),
        train_prompts=4,
        heldout_per_level=4,
        settings=SMALL,
        arms=arms,
        seeds={a: seeds for a in arms},
        primary=tuple(arms),
        second_base="GRPO",
        **kw,
    )


@pytest.mark.slow
def test_the_stated_power_is_the_coded_rules_and_a_simulation_of_the_rule_agrees():
    """Power and the detectable effect are those of the rule as coded (one real effect in a Holm family of
    m is tested at 0.05 / m, through the interval at the same level), not of a lone test at 0.05, and a
    simulation of the rule itself (its exact sign-flip p, Holm, its interval) agrees within a few points."""
    from avspo_openrlhf.study.compare import detectable_effect, equivalence_chance, power_at, simulate_rule

    # the numbers: sd 7, 24 seeds, Holm over 4: 5.1 points detectable, not 4.2; 29 % and 78 %, not 52 and 92
    assert detectable_effect(0.07, 24, 4) == pytest.approx(0.0512, abs=5e-4)
    assert detectable_effect(0.07, 24, 1) == pytest.approx(0.0419, abs=5e-4)
    assert power_at(0.03, 0.07, 24, 4) == pytest.approx(0.29, abs=0.01)
    assert power_at(0.05, 0.07, 24, 4) == pytest.approx(0.78, abs=0.01)
    for effect in (0.03, detectable_effect(0.09, 24, 3)):
        sim = simulate_rule(effect, 0.09, 24, 3, margin=0.05, reps=600, seed=1)
        assert sim["better"] == pytest.approx(power_at(effect, 0.09, 24, 3), abs=0.05), (effect, sim)
    null = simulate_rule(0.0, 0.09, 24, 3, margin=0.05, reps=600, seed=2)
    assert null["better"] + null["worse"] < 0.05  # one arm's share of the family-wise error
    assert null["equivalent"] == pytest.approx(equivalence_chance(0.09, 24, 3, 0.05), abs=0.06)


def test_the_primary_seeds_are_the_ones_the_rule_needs_and_the_design_page_is_generated():
    from avspo_openrlhf.study.compare import detectable_effect, seeds_for_effect

    sys.modules.pop("run", None)  # another study's run.py may be imported under that name already
    sys.path.insert(0, str(ROOT / "experiments" / "remedies_gpu"))
    try:
        import run as study_file
    finally:
        sys.path.pop(0)
        sys.modules.pop("run", None)
    st = study_file.STUDY
    assert "DAPO-DS" not in st.family and len(st.family) == 3  # a learning-rate confound: exploratory
    n = seeds_for_effect(study_file.PLANNING_SD, study_file.TARGET_EFFECT, len(st.family))
    assert study_file.PRIMARY_SEEDS == n >= 24 and all(st.seeds[a] == n for a in st.primary)
    assert detectable_effect(st.planning_sd, n, 3) <= 0.05 < detectable_effect(st.planning_sd, n - 1, 3)
    page = ROOT / "experiments" / "remedies_gpu" / "results" / "design.md"
    assert page.read_text(encoding="utf-8") == "\n".join(st.design_lines()) + "\n", "rerun run.py --design"


@pytest.mark.slow
def test_the_verdict_reads_the_planned_seeds_and_no_other(tmp_path):
    """An extra seed changes no verdict and no number of the primary table (it has its own labelled
    table); a missing planned seed leaves the study without a verdict, whatever seed stands in for it."""
    st = _three(8)
    runs = [_fake_with("GRPO", s, 0.5) for s in range(8)]
    runs += [
        _fake_with(a, s, 0.5 + d + 0.02 * (s % 3))
        for a, d in (("AVSPO", 0.2), ("sign", 0.0), ("RL-ZVP", -0.01))
        for s in range(8)
    ]
    st.report(runs, tmp_path / "planned")
    planned = json.loads((tmp_path / "planned" / "results.json").read_text())
    assert planned["decision"]["complete"] and planned["decision"]["verdicts"]["AVSPO"] == "better than GRPO"
    # seed 8 of every arm, RL-ZVP's far below: the same verdicts and numbers, and a table of its own
    extra = runs + [_fake_with("GRPO", 8, 0.9)] + [_fake_with(a, 8, 0.1) for a in ("AVSPO", "sign", "RL-ZVP")]
    text = st.report(extra, tmp_path / "extra")
    got = json.loads((tmp_path / "extra" / "results.json").read_text())
    assert got["decision"] == planned["decision"]
    assert got["summary"]["AVSPO"]["vs_GRPO"] == planned["summary"]["AVSPO"]["vs_GRPO"]
    assert "Runs beyond the planned seeds" in text and "| RL-ZVP | 8 | 10.0 |" in text
    assert st.split_planned([_fake_with("GRPO", -1, 0.5)]) == ([], [_fake_with("GRPO", -1, 0.5)])  # no seed -1
    # seed 7 of sign missing, seed 8 in its place: incomplete, no verdict, the missing seed named
    holes = [r for r in extra if not (r["method"] == "sign" and r["seed"] == 7)]
    text = st.report(holes, tmp_path / "holes")
    decision = json.loads((tmp_path / "holes" / "results.json").read_text())["decision"]
    assert not decision["complete"] and decision["missing_seeds"]["sign"] == [7]
    assert set(decision["verdicts"].values()) == {"no verdict yet"} and "sign 1 of 8" in text


def test_the_interval_beside_a_verdict_is_at_its_holm_level_and_identical_arms_are_said_so():
    from avspo_openrlhf import stats
    from avspo_openrlhf.study.compare import holm, rule

    # 8 seeds: the smallest sign-flip p is 2 / 256, times 3 below 0.05 (with 6 seeds no remedy could differ)
    d = {
        "a": [0.1, 0.12, 0.09, 0.11, 0.1, 0.13, 0.1, 0.11],
        "b": [0.0, 0.01, -0.01, 0.02, -0.02, 0.0, 0.01, -0.01],
        "c": [0.0] * 8,
    }
    got = rule(d, margin=0.05)
    # b and c tie at p = 1 (every difference sums to 0): one Holm p, one level, their first rank's
    assert [round(got[a]["level"], 6) for a in "abc"] == [round(1 - 0.05 / 3, 6), 0.975, 0.975]
    assert got["a"]["ci"] == pytest.approx(list(stats.t_interval(d["a"], 1 - 0.05 / 3)[2:]))
    assert got["a"]["verdict"] == "better" and got["a"]["holm"] == pytest.approx(3 * 2 / 256)
    assert got["b"]["verdict"] == "equivalent" and got["c"]["verdict"] == "identical"
    # tied p's, which Holm adjusts alike, share the level of their first rank
    from avspo_openrlhf.study.compare import holm_levels

    assert holm_levels({"x": 0.01, "y": 0.01, "z": 0.5}) == pytest.approx(
        {"x": 1 - 0.05 / 3, "y": 1 - 0.05 / 3, "z": 0.95}
    )
    # Holm as statsmodels has it
    from statsmodels.stats.multitest import multipletests

    p = {"x": 0.01, "y": 0.04, "z": 0.03, "w": 0.5}
    assert list(holm(p).values()) == pytest.approx(list(multipletests(list(p.values()), method="holm")[1]))


@pytest.mark.slow
def test_a_run_that_fails_for_good_is_scored_by_the_rule_and_a_crash_is_listed(assets, tmp_path):
    """A run whose own error stopped it in two launches is scored by the rule fixed before the runs
    (its last mid-run evaluation), never run again nor replaced, and counts in its seed's pair; a run
    whose batch crashed is listed as stopped, to resume."""
    from avspo_openrlhf.study import compare, store
    from avspo_openrlhf.study.loop import note_failure
    from avspo_openrlhf.study.scheduler import Job

    st = _three(3)
    run_dir = tmp_path / "out" / "AVSPO_seed2"
    run_dir.mkdir(parents=True)
    job = Job(st.spec("AVSPO", 2, assets["model"], (assets["train"], assets["heldout"])), run_dir)
    note_failure(run_dir, "Traceback ...\nValueError: boom")
    assert st.failed_for_good(job, "fp32") is None  # one launch: it resumes
    (run_dir / "mid_evals.json").write_text(
        json.dumps(
            [
                {"milestone": 0, "tokens": 0, "step": 0, "pass1": 0.2},
                {"milestone": 40, "tokens": 48, "step": 5, "pass1": 0.35},
            ]
        )
    )
    note_failure(run_dir, "ValueError: boom again")
    r = st.failed_for_good(job, "fp32")
    assert r["failed"] and r["heldout_pass1"] == 0.35 and "step 5" in r["score_rule"] and r["attempts"] == 2
    crashed = tmp_path / "out" / "sign_seed1"
    crashed.mkdir()
    (crashed / "crashed.json").write_text(json.dumps({"exit_code": -9, "log": "batch.log", "time": 0}))
    same = {"settings": r["settings"], "settings_hash": r["settings_hash"]}  # the failed run's own settings
    runs = [_fake_with("GRPO", s, 0.5, **same) for s in range(3)] + [
        _fake_with("AVSPO", s, 0.6, **same) for s in range(2)
    ]
    collected = store.collect(tmp_path / "out", None) + runs
    assert [x for x in collected if x.get("failed")] == [json.loads((run_dir / "failed.json").read_text())]
    c = compare.paired(collected, "AVSPO", "GRPO", lambda k: "add1")
    assert c["per_seed"] == pytest.approx([0.1, 0.1, 0.35 - 0.5])  # the failed seed counts, scored by the rule
    failures = st.failures(tmp_path / "out")
    assert list(failures) == ["sign"] and "crashed (exit -9" in failures["sign"][0]
    text = st.report([x for x in collected], tmp_path / "pub", failures)
    assert "failed for good {2: 'its last mid-run evaluation (step 5, 48 tokens)'}" in text
    assert "sign: stopped, to resume: seed 1: its process crashed" in text


def test_runs_made_elsewhere_are_taken_only_from_the_frozen_commit_and_hash_and_never_twice(tmp_path):
    from avspo_openrlhf.study import store

    frozen = tmp_path / "FROZEN"
    frozen.write_text("x\n")
    st = _three(2, frozen_file=str(frozen))
    pub, came = tmp_path / "pub", tmp_path / "came"
    for r in [_fake_with("GRPO", 0, 0.5), _fake_with("AVSPO", 0, 0.6)]:
        store.write_run(r, came / f"{r['method']}_seed{r['seed']}.json", 4)
    assert "took 2 runs" in st.take(came, pub) and len(store.read_runs(pub)) == 2
    assert "took 0 runs" in st.take(came, pub)  # identical files again: skipped, nothing twice
    bad = tmp_path / "bad"
    for name, r in {
        "commit": _fake_with("GRPO", 1, 0.5, commit="y"),
        "hash": _fake_with("AVSPO", 1, 0.5, settings_hash="other"),
        "seed": _fake_with("sign", 2, 0.5),
        "twice": _fake_with("GRPO", 0, 0.7),
    }.items():
        store.write_run(r, bad / name / f"{r['method']}_seed{r['seed']}.json", 4)
        store.write_run(_fake_with("sign", 0, 0.5), bad / name / "sign_seed0.json", 4)  # a good one beside it
        with pytest.raises(StudyError, match="refused every run") as e:
            st.take(bad / name, pub)
        assert {
            "commit": "not the frozen x",
            "hash": "differ in",
            "seed": "not a planned run",
            "twice": "published already with other content",
        }[name] in str(e.value)
    assert len(store.read_runs(pub)) == 2  # all or none: the good one beside each was not taken
    # a smoke run of the frozen commit at another budget is not the study's, whatever its hash
    other = tmp_path / "other"
    settings = {**_fake("GRPO", 1, 0.5)["settings"], "settings": {**dataclasses.asdict(SMALL), "token_budget": 7}}
    store.write_run(_fake_with("GRPO", 1, 0.5, settings=settings), other / "GRPO_seed1.json", 4)
    with pytest.raises(StudyError, match="not the study's settings.*token_budget"):
        st.take(other, pub)
    # a run's failed launches elsewhere: published under failures/, the larger count kept, listed by the report
    fails = tmp_path / "fails"
    fails.mkdir()
    (fails / "sign_seed1.failure.json").write_text(json.dumps({"attempts": 1, "error": "ValueError: x", "time": 0}))
    assert "1 records of failed launches" in st.take(fails, pub)
    (listed,) = st.failures(tmp_path / "no_runs_here", pub)["sign"]
    assert "its own error in 1 launch(es) elsewhere" in listed


def test_a_runs_failed_launches_add_up_across_machines_and_only_its_own_errors_count(tmp_path):
    """A GPU slot is a fresh machine: a run's failed launches are published and restored into its
    folder on the next, so that a second failure there makes it fail for good; out of memory, a device
    error, a busy folder or a folder of another spec are the machine's, not the run's."""
    import torch

    from avspo_openrlhf.folder_lock import FolderBusy
    from avspo_openrlhf.study.loop import SpecMismatch, note_failure, own_error

    pub, run_dir = tmp_path / "pub", tmp_path / "here" / "AVSPO_seed0"
    run_dir.mkdir(parents=True)
    note_failure(run_dir, "ValueError: bad row")
    GPURemediesStudy.keep_failure(run_dir, pub, str(tmp_path / "export"))
    assert json.loads((tmp_path / "export" / "AVSPO_seed0.failure.json").read_text())["attempts"] == 1
    fresh = tmp_path / "next_machine" / "AVSPO_seed0"
    GPURemediesStudy.restore_failure(fresh, pub)
    assert note_failure(fresh, "ValueError: bad row")["attempts"] == 2  # the rule's second launch
    assert own_error(ValueError("bad row")) and own_error(FloatingPointError("nan"))
    for machine in (
        torch.OutOfMemoryError("CUDA out of memory"),
        MemoryError(),
        RuntimeError("CUDA error: an illegal memory access was encountered"),
        FolderBusy("busy"),
        SpecMismatch("another spec"),
        KeyboardInterrupt(),
    ):
        assert not own_error(machine), machine


@pytest.mark.slow
def test_probability_of_improvement_and_p_formatting():
    from avspo_openrlhf.study.compare import probability_of_improvement
    from avspo_openrlhf.study.tables import fmt_p

    better = probability_of_improvement([[0.9], [0.8], [0.85]], [[0.1], [0.2], [0.15]])
    assert better["poi"] == 1.0 and better["ci95"] == [1.0, 1.0]
    same = probability_of_improvement([[0.5], [0.5]], [[0.5], [0.5]])
    assert same["poi"] == 0.5
    assert fmt_p(0.0004) == "< 0.001" and fmt_p(0.0123) == "0.012"


# ── 10. a user's remedy as an arm ──


@pytest.mark.slow
def test_a_plugin_remedy_runs_as_an_arm_in_the_loops_process(assets, tmp_path):
    plugin = str(REPO / "examples" / "qae_remedy.py")
    s = dataclasses.replace(
        spec(assets, Arm("grpo"), final_eval=False, mid_eval_tokens=0, token_budget=40), plugins=(plugin,)
    )
    text = s.to_json().replace('"estimator": "grpo"', '"estimator": "qae"')
    (tmp_path / "spec.json").write_text(text)
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(TESTS), os.environ.get("PYTHONPATH", "")])}
    out = subprocess.run(
        [
            sys.executable,
            "-m",
            "avspo_openrlhf.study.loop",
            str(tmp_path / "spec.json"),
            str(tmp_path / "run"),
            "--threads",
            "1",
        ],
        capture_output=True,
        text=True,
        env=env,
        timeout=300,
    )
    assert out.returncode == 0, out.stdout + out.stderr
    res = json.loads((tmp_path / "run" / "result.json").read_text())
    assert res["arm"]["estimator"] == "qae" and res["settings"]["plugins"] == [plugin]


def test_a_reward_outside_the_declared_range_stops_the_run_at_its_first_step(assets, tmp_path):
    run = loop.Run(spec(assets, Arm("avspo"), reward="study_reward:ten", final_eval=False), tmp_path / "a")
    with pytest.raises(ValueError, match=r"acr\.reward_range is \(0, 1\) but a raw reward is 10"):
        run.step()
    ok = spec(
        assets,
        Arm("avspo"),
        reward="study_reward:ten",
        final_eval=False,
        acr={"tau_init": 0.25, "window": 2, "reward_range": (0.0, 10.0)},
    )
    assert loop.Run(ok, tmp_path / "b").step()["groups_trained"] == 2
