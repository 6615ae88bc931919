"""The remedies study's design, made right before its runs (issue 56), on the CPU: on-policy
log-probs at the sampling temperature, controls that control, a non-finite step skipped and
counted, runs keyed by their settings, common random numbers, a held-out set disjoint from
training, evaluations at fixed token milestones, and the decision rule in code."""

from __future__ import annotations

import dataclasses
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch
from helpers import small_study

from avspo_openrlhf.algo import ACRConfig, AVSPOConfig, CollapseController, collapse_stats
from avspo_openrlhf.study import loop
from avspo_openrlhf.study.controls import format_reward, random_sign_advantages, sampling_seed
from avspo_openrlhf.study.loop import Arm, RunSpec
from avspo_openrlhf.study.remedies_gpu import GPURemediesStudy, StudyError, check_pairable

pytest.importorskip("transformers")
REPO = Path(__file__).resolve().parents[1]
TESTS = Path(__file__).resolve().parent
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
        lp, ent = loop.token_logprobs_entropy(logits, targets, T, True)
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
        lp, _ = loop.token_logprobs_entropy(z[:, None, :].expand(64, 50, 50), vocab, temperature_of_logprobs, False)
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
        ref, _ = loop.token_logprobs_entropy(logits, ro.ids[:, -width_c:], 0.7, False)
    monkeypatch.setattr(torch.nn.functional, "scaled_dot_product_attention", nan_where_blind)

    def grads_finite(forward) -> bool:
        model.zero_grad(set_to_none=True)
        (forward() * ro.mask).sum().backward()
        return all(torch.isfinite(p.grad).all() for p in model.parameters() if p.grad is not None)

    def with_2d_mask():
        logits = model(input_ids=ro.ids, attention_mask=ro.attn, position_ids=pos).logits[:, -width_c - 1 : -1]
        return loop.token_logprobs_entropy(logits, ro.ids[:, -width_c:], 0.7, False)[0]

    assert not grads_finite(with_2d_mask) and sum(blind_rows) > 0
    blind_rows.clear()
    lp = run.policy.logprobs_entropy(ro.ids, ro.attn, width_c, False, 0.7)[0]
    assert grads_finite(lambda: run.policy.logprobs_entropy(ro.ids, ro.attn, width_c, False, 0.7)[0])
    assert blind_rows and sum(blind_rows) == 0
    m = ro.mask.bool()
    assert torch.allclose(lp[m], ref[m], atol=1e-6)
    # eager attention takes the same mask as an additive one
    eager = loop.training_attention_mask(ro.attn, "eager")
    assert eager.dtype == torch.float32 and torch.equal(eager == 0, loop.training_attention_mask(ro.attn))
    assert loop.training_attention_mask(ro.attn, "flash_attention_2") is ro.attn
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
    assert {"model", "train", "heldout", "code", "precision"} <= set(a["settings"]) and a["commit"]
    assert "micro_batch" not in a["settings"]["settings"]  # speed, not semantics


# ── 5. common random numbers ──


def test_two_arms_with_one_seed_draw_the_same_sampling_numbers_at_every_step(assets, tmp_path, monkeypatch):
    """GRPO, AVSPO and DAPO-DS (whose refill rounds draw more numbers in a step) start every step's
    first generation round from the same random state; with the same weights, the same tokens."""
    drawn: dict[str, dict[int, torch.Tensor]] = {}
    ids: dict[str, torch.Tensor] = {}
    real_rollout, real_generate = loop.Run._rollout_g, loop.Policy.generate
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
    monkeypatch.setattr(loop.Policy, "generate", generate)
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


def test_a_partial_study_has_the_banner_and_a_holm_family_of_four(tmp_path):
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
    assert "Power, from the measured sd" in text and "detectable effect" in text
    # every primary arm complete: a verdict, and p below 0.001 printed as such
    full = runs + [
        _fake(a, s, 0.5 + (0.2 if a == "sign" else 0.0) + 0.01 * s)
        for a in ("sign", "RL-ZVP", "DAPO-DS")
        for s in range(4)
    ]
    text = st.report(full, tmp_path)
    assert "Incomplete" not in text
    decision = json.loads((tmp_path / "results.json").read_text())["decision"]
    assert decision["complete"] and decision["verdicts"]["RL-ZVP"] in (
        "inconclusive",
        "no difference larger than 3 points",
    )
    with pytest.raises(StudyError, match="differ in"):
        st.report(full + [_fake("GRPO", 9, 0.5, hash_="other")], tmp_path)


def test_probability_of_improvement_and_p_formatting():
    from avspo_openrlhf.study.remedies_gpu import probability_of_improvement
    from avspo_openrlhf.study.tables import fmt_p

    better = probability_of_improvement([[0.9], [0.8], [0.85]], [[0.1], [0.2], [0.15]])
    assert better["poi"] == 1.0 and better["ci95"] == [1.0, 1.0]
    same = probability_of_improvement([[0.5], [0.5]], [[0.5], [0.5]])
    assert same["poi"] == 0.5
    assert fmt_p(0.0004) == "< 0.001" and fmt_p(0.0123) == "0.012"


# ── 10. a user's remedy as an arm ──


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
