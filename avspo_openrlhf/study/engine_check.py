"""Does batching runs change an update beyond rounding? One update of every arm by both study engines,
from the same weights on the same rollout, compared against the rounding scale of the precision.

The process engine (``hf_engine.HFEngine``: one transformers model and torch AdamW per run) and the
stacked engine (``engine.StackedEngine``: K runs' weights stacked, one batched forward and backward,
``stacked.StackedAdamW``) must give each run the same update up to floating-point rounding. Here every
arm is a real :class:`~avspo_openrlhf.study.loop.Run` whose first step (``Run.step_g``: rewards, the
controller's advantages, the random-sign control, RL-ZVP's signs, the :class:`Update` request) is
driven by hand: each of its generation requests is answered with one shared rollout (sampled once by
an ``HFEngine`` from the initial weights), the verifier is replaced by fixed rewards [P, G] that hold
mixed, all-wrong and all-right groups, and its update request goes to the engine's own ``_update``.

Per arm: the stacked update against the process one (``dw_rel`` = ||dW_s - dW_p|| / ||dW_p||, over every
weight; ``grad_rel`` the same for the clipped gradient, read from AdamW's first moment; ``grad_norm_rel``
of the gradient norms before clipping; the losses; the largest difference of an updated weight), and the
rounding scale: the process update in the requested precision against the same in fp32. The gradient
is measured beside the weights because AdamW's first step, lr * g / (|g| + eps), is about lr * sign(g):
blind to the gradient's scale (the norm sees it) and a full step for a near-zero gradient's rounding.
An arm is ``ok`` when each difference is at most :data:`FACTOR` x its rounding scale (at least
:data:`FLOOR`: in fp32 the scale is 0). ``padding_tokens`` counts the batch's real tokens whose id is the
model's ``padding_idx`` (SmolLM2's pad is its EOS, a token of every chat prompt): transformers'
embedding gives that row no gradient from them, the stacked forward's lookup does, so there the
engines differ by more than rounding.

    python -m avspo_openrlhf.study.engine_check --model tiny|smollm2|smollm2-shape|FOLDER \\
        --dtype fp32|bf16 --out FILE.json [--study experiments/remedies_gpu/run.py]
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import math
import runpy
import sys
import tempfile
import time
from pathlib import Path

import torch

from avspo_openrlhf.folder_lock import release_folder
from avspo_openrlhf.study.engine import StackedEngine
from avspo_openrlhf.study.hf_engine import HFEngine
from avspo_openrlhf.study.loop import Run
from avspo_openrlhf.study.protocol import Generate, Update
from avspo_openrlhf.study.spec import Arm, RunSpec, StudySettings, device_and_dtype, device_name

FACTOR = 2.0  # stacked vs process may differ by this many times the precision's own rounding
FLOOR = 1e-4  # the least limit: fp32's rounding scale is 0 by construction
QUANTITIES = ("dw_rel", "grad_rel", "grad_norm_rel")  # what the verdict reads

# SmolLM2-135M's architecture (its config.json), for a random model of its shape: a GPU check in a
# minute without the 94 MB model
SMOLLM2_SHAPE = {
    "vocab_size": 49152,
    "hidden_size": 576,
    "num_hidden_layers": 30,
    "num_attention_heads": 9,
    "num_key_value_heads": 3,
    "intermediate_size": 1536,
    "tie_word_embeddings": True,
    "rms_norm_eps": 1e-5,
    "rope_theta": 100000.0,
    "max_position_embeddings": 8192,
}


def every_update() -> dict:
    """One arm of each kind of update the study's arms make (DAPO-DS's is GRPO's, on the groups its refill
    rounds kept): the check's default arms, on the CPU and on a GPU alike."""
    from avspo_openrlhf.study.spec import Arm

    return {
        "GRPO": Arm("grpo"),
        "AVSPO": Arm("avspo", {"strategy": "stratified"}),
        "sign": Arm("sign"),
        "RL-ZVP": Arm("rl_zvp", {"std_convention": "population", "eps": 1e-6}),
        "NGRPO": Arm("ngrpo"),
        "random-sign": Arm("grpo", control="random_sign"),
        "DAPO-DS": Arm("grpo", dynamic=True),
    }


def fixed_rewards(P: int, G: int, lo: float = 0.0, hi: float = 1.0) -> torch.Tensor:
    """``[P, G]`` rewards that hold every kind of group: group ``i`` is mixed (``i % 3 == 0``; between 1
    and G - 1 of its completions right), all-wrong (``i % 3 == 1``) or all-right (``i % 3 == 2``)."""
    out = torch.full((P, G), lo)
    for i in range(P):
        if i % 3 == 0:
            out[i, : 1 + (i // 3) % (G - 1)] = hi
        elif i % 3 == 2:
            out[i] = hi
    return out


def relative(diff_sq: float, ref_sq: float) -> float:
    """||a - b|| / ||b|| from squared norms; 0 when both are 0 (no update at all, in both)."""
    if ref_sq == 0.0:
        return 0.0 if diff_sq == 0.0 else math.inf
    return math.sqrt(diff_sq / ref_sq)


def compare(a: dict, b: dict) -> dict:
    """How update ``a`` differs from the reference ``b`` (each :func:`_measure`'s output)."""
    sq = {"dw": 0.0, "dw_ref": 0.0, "g": 0.0, "g_ref": 0.0}
    w_max = 0.0
    for name, w in b["w"].items():
        sq["dw"] += float((a["dw"][name].double() - b["dw"][name].double()).pow(2).sum())
        sq["dw_ref"] += float(b["dw"][name].double().pow(2).sum())
        sq["g"] += float((a["m"][name].double() - b["m"][name].double()).pow(2).sum())
        sq["g_ref"] += float(b["m"][name].double().pow(2).sum())
        w_max = max(w_max, float((a["w"][name] - w).abs().max()))
    gn_a, gn_b = a["row"]["grad_norm"], b["row"]["grad_norm"]
    return {
        "dw_rel": relative(sq["dw"], sq["dw_ref"]),
        "grad_rel": relative(sq["g"], sq["g_ref"]),
        "grad_norm_rel": abs(gn_a - gn_b) / gn_b if gn_b else (0.0 if gn_a == gn_b else math.inf),
        "w_max_abs": w_max,
        "loss_abs": abs(a["row"]["loss"] - b["row"]["loss"]),
        "same_advantages": bool(torch.equal(a["adv"], b["adv"])),
        "both_stepped": not a["row"]["update_skipped"] and not b["row"]["update_skipped"],
    }


def verdict(diff: dict, rounding: dict | None) -> tuple[str, list[str]]:
    """``ok`` or ``fail`` for one arm, with what failed: a stacked-vs-process difference above
    :data:`FACTOR` x the rounding scale (``rounding`` None: fp32, the :data:`FLOOR` alone)."""
    why = [
        f"{q} {diff[q]:.3g} > limit {limit(q, rounding):.3g}" for q in QUANTITIES if not diff[q] <= limit(q, rounding)
    ]
    if not diff["same_advantages"]:
        why.append("the engines' runs built different advantages")
    if not diff["both_stepped"]:
        why.append("an engine skipped the update (non-finite gradient)")
    return ("fail" if why else "ok"), why


def limit(q: str, rounding: dict | None) -> float:
    """The most ``q`` may differ. A gradient norm is one number, a noisy scale of its own rounding; its
    relative change is at most the gradient's (|‖a‖ - ‖b‖| <= ‖a - b‖), so that scale counts too."""
    if not rounding:
        return FLOOR
    scale = max(rounding[q], rounding["grad_rel"]) if q == "grad_norm_rel" else rounding[q]
    return max(FACTOR * scale, FLOOR)


# ── driving a run's first step by hand ──


class SharedRollouts:
    """Every generation request answered with one rollout per distinct request, sampled by an
    ``HFEngine`` (the process engine's generation) from the initial weights: both engines, and the
    fp32 reference, train on the same tokens."""

    def __init__(self, spec: RunSpec):
        self.engine = HFEngine(spec, controller=None)  # generation only: no update, so no controller
        self.cache: dict[tuple, object] = {}

    def __call__(self, req: Generate):
        key = (tuple(req.problems), req.n, req.max_new_tokens, req.temperature, req.seed, req.batch)
        if key not in self.cache:
            self.cache[key] = self.engine.serve(req)
        return self.cache[key]

    def padding_tokens(self) -> dict:
        """The rollouts' real tokens (attended) whose id is the model's ``padding_idx``: transformers'
        embedding gives that row no gradient from them, a plain lookup does (a pad token that is
        also a token of the text, as SmolLM2's EOS, or one a completion sampled)."""
        pad = self.engine.policy.model.get_input_embeddings().padding_idx
        n = sum(int(((ro.ids == pad) & (ro.attn > 0)).sum()) for ro in self.cache.values()) if pad is not None else 0
        return {"padding_idx": pad, "real_tokens": n}


def start_step(run: Run, rollouts: SharedRollouts):
    """``run``'s first step up to its update request: ``(the step's generator, the Update)``. The
    verifier gives :func:`fixed_rewards` (the pattern the check needs, not what the model wrote)."""
    G = run.spec.settings.group_size
    lo, hi = run.controller.reward_range
    run.score = lambda texts, golds: fixed_rewards(len(texts) // G, G, lo, hi).flatten().tolist()
    steps = run.step_g()
    req = next(steps)
    while isinstance(req, Generate):
        req = steps.send(rollouts(req))
    if not isinstance(req, Update):
        raise TypeError(f"a run's step asked for {type(req).__name__}, not a Generate or an Update")
    return steps, req


def finish_step(steps, answer: dict) -> dict:
    """The step's row (loss, grad_norm, update_skipped, ...) once the engine has answered its update."""
    try:
        steps.send(answer)
    except StopIteration as done:
        return done.value
    raise RuntimeError("a run's step asked for more than one update")


def _measure(weights: dict, before: dict, moments: dict, row: dict, req: Update) -> dict:
    """One engine's update of one run: weights after, their change, the first moment (0.1 x the
    clipped gradient after AdamW's first step), the step's row and the advantages it trained on."""
    return {
        "w": weights,
        "dw": {n: w - before[n] for n, w in weights.items()},
        "m": moments,
        "row": row,
        "adv": req.adv.detach().cpu(),
    }


def process_update(spec: RunSpec, folder: Path, rollouts: SharedRollouts, names: list[str]) -> dict:
    """One update of ``spec``'s run by the process engine (its own ``HFEngine._update``)."""
    run = Run(spec, folder)
    try:
        steps, req = start_step(run, rollouts)
        model = run.engine.policy.model
        params = dict(model.named_parameters())
        before = {n: params[n].detach().clone() for n in names}
        row = finish_step(steps, run.engine.serve(req))
        state = run.engine.optimizer.state
        moments = {
            n: state[params[n]]["exp_avg"].detach().clone() if params[n] in state else torch.zeros_like(before[n])
            for n in names
        }
        weights = {n: params[n].detach().clone() for n in names}
        return _measure(weights, before, moments, row, req)
    finally:
        run.wait_checkpoint()
        release_folder(str(folder))


def stacked_updates(specs: list[RunSpec], folders: list[Path], rollouts: SharedRollouts) -> tuple[dict, list]:
    """One batched update of every run by the stacked engine (its own ``StackedEngine._update``):
    ``({k: measured, or the error of a run the engine failed}, the parameter names)``."""
    engine = StackedEngine(specs, folders, log=lambda line: None)
    try:
        started = {k: start_step(run, rollouts) for k, run in engine.runs.items()}
        names = list(engine.params)
        before = {n: p[0].detach().clone() for n, p in engine.params.items()}  # every run starts from these
        answers = engine._update({k: req for k, (_, req) in started.items()})
        out: dict[int, dict | str] = {k: f"the stacked engine failed the run: {e}" for k, e in engine.failed.items()}
        for k, (steps, req) in sorted(started.items()):
            if k not in answers:
                continue
            row = finish_step(steps, answers[k])
            weights = {n: p[k].detach().clone() for n, p in engine.params.items()}
            moments = {n: engine.opt.m[n][k].clone() for n in names}
            out[k] = _measure(weights, before, moments, row, req)
        return out, names
    finally:
        for f in folders:
            release_folder(str(f))


def _free(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.empty_cache()


def check_arm(measured: dict | str, spec: RunSpec, folder: Path, rollouts: SharedRollouts, names: list[str]) -> dict:
    """One arm's record: its stacked update (``measured``, or the error that failed it) against the
    process engine's, the rounding scale (the process update against the same in fp32; None in fp32),
    the limits and the verdict."""
    if isinstance(measured, str):
        return {"verdict": "fail", "why": [measured]}
    try:
        proc = process_update(spec, folder / "process", rollouts, names)
        rounding = None
        if device_and_dtype(spec.settings)[1] != torch.float32:
            ref = process_update(
                dataclasses.replace(spec, settings=dataclasses.replace(spec.settings, dtype="fp32")),
                folder / "fp32",
                rollouts,
                names,
            )
            rounding = {q: v for q, v in compare(proc, ref).items() if q in QUANTITIES}
    except Exception as e:  # one arm's failure is its verdict; the others are still checked
        return {"verdict": "fail", "why": [f"the process engine: {type(e).__name__}: {e}"]}
    diff = compare(measured, proc)
    result, why = verdict(diff, rounding)
    return {
        **diff,
        "loss": {"process": proc["row"]["loss"], "stacked": measured["row"]["loss"]},
        "grad_norm": {"process": proc["row"]["grad_norm"], "stacked": measured["row"]["grad_norm"]},
        "rounding": rounding,
        "limits": {q: limit(q, rounding) for q in QUANTITIES},
        "verdict": result,
        "why": why,
    }


def check_engines(
    model: str,
    settings: StudySettings,
    arms: dict[str, Arm],
    seed: int = 0,
    train: str | None = None,
    log=print,
) -> dict:
    """One update of every arm by both engines from ``model``'s weights (``settings.dtype`` the
    precision; ``train`` a jsonl of problems, else synthetic arithmetic), compared: the result's
    ``arms`` hold each arm's differences, its rounding scale (None in fp32), limits and verdict."""
    from avspo_openrlhf.data.io import write_jsonl
    from avspo_openrlhf.data.tasks import synthetic_arithmetic

    if settings.prompts_per_step < 3:
        raise ValueError("the check needs prompts_per_step >= 3: a mixed, an all-wrong and an all-right group")
    device, dtype = device_and_dtype(settings)
    precision = "fp32" if dtype == torch.float32 else "bf16"
    t0 = time.perf_counter()
    with tempfile.TemporaryDirectory(prefix="engine_check_") as tmp:
        root = Path(tmp)
        if train is None:  # enough problems for DAPO-DS's refill rounds
            train = str(root / "train.jsonl")
            n = settings.prompts_per_step * settings.dynamic_max_rounds
            write_jsonl(synthetic_arithmetic(n, ["add1", "mul1", "add2", "multi"], seed=seed), train)

        def spec(method: str, engine: str) -> RunSpec:
            s = dataclasses.replace(settings, engine=engine)
            return RunSpec(
                method=method, seed=seed, arm=arms[method], settings=s, model=model, train=train, heldout=train
            )

        names = list(arms)
        rollouts = SharedRollouts(spec(names[0], "process"))
        log(f"[engine check] {len(names)} arms on {device_name(device)} in {precision}: the stacked update")
        st, params = stacked_updates(
            [spec(a, "stacked") for a in names], [root / a / "stacked" for a in names], rollouts
        )
        padding = rollouts.padding_tokens()
        _free(device)
        out = {}
        for k, a in enumerate(names):
            out[a] = check_arm(st.pop(k), spec(a, "process"), root / a, rollouts, params)
            log(f"[engine check] {a}: {out[a]['verdict']}{''.join('; ' + w for w in out[a]['why'])}")
            _free(device)
        del rollouts
    import transformers

    return {
        "device": device_name(device),
        "dtype": precision,
        "torch": torch.__version__,
        "transformers": transformers.__version__,
        "model": model,
        "seed": seed,
        "settings": dataclasses.asdict(settings),
        "factor": FACTOR,
        "floor": FLOOR,
        "padding_tokens": padding,
        "ok": all(r["verdict"] == "ok" for r in out.values()),
        "wall_s": time.perf_counter() - t0,
        "arms": out,
    }


def table(result: dict) -> str:
    """One line per arm: the stacked-vs-process differences, the rounding scale and the verdict."""
    pad = result["padding_tokens"]
    lines = [
        f"engine check: {result['device']}, {result['dtype']}, torch {result['torch']}, {result['wall_s']:.0f} s; "
        f"{pad['real_tokens']} real tokens of the batch have the padding_idx ({pad['padding_idx']})",
        f"{'arm':<16} {'dw_rel':>9} {'grad_rel':>9} {'gnorm_rel':>9} {'w_max_abs':>9} {'loss_abs':>9}"
        f"  {'rounding dw/grad/gnorm':>26}  verdict",
    ]
    for a, r in result["arms"].items():
        if "dw_rel" not in r:
            lines.append(f"{a:<16} {r['verdict']}: {'; '.join(r['why'])}")
            continue
        rnd = r["rounding"]
        scale = "/".join(f"{rnd[q]:.2g}" for q in QUANTITIES) if rnd else "fp32"
        lines.append(
            f"{a:<16} {r['dw_rel']:9.2e} {r['grad_rel']:9.2e} {r['grad_norm_rel']:9.2e} {r['w_max_abs']:9.2e} "
            f"{r['loss_abs']:9.2e}  {scale:>26}  {r['verdict']}{'' if not r['why'] else ': ' + '; '.join(r['why'])}"
        )
    return "\n".join(lines)


# ── models ──


def smollm2_shape(out_dir: str | None = None, seed: int = 0) -> str:
    """A random model of SmolLM2-135M's architecture at ``out_dir`` (kept: built once per machine),
    with SmolLM2's tokenizer where its GGUF and ``gguf`` are installed, else the tiny model's (its ids
    fit the vocabulary). Its pad token is its EOS, as in SmolLM2's config (``pad_token_id`` 2,
    ``<|im_end|>``): a token of every chat prompt, and transformers' embedding gives its padding row
    no gradient."""
    import importlib.util
    import os

    from transformers import AutoTokenizer, LlamaConfig, LlamaForCausalLM

    from avspo_openrlhf.cpu.models import DEFAULT_CACHE, model_is_complete, prepare

    out_dir = out_dir or os.path.join(DEFAULT_CACHE, "smollm2-shape")
    if model_is_complete(out_dir):
        return out_dir
    try:
        if importlib.util.find_spec("gguf") is None:
            raise FileNotFoundError("gguf is not installed")
        from avspo_openrlhf.cpu.models import _smollm2_gguf

        folder, name = os.path.split(_smollm2_gguf())
        tok = AutoTokenizer.from_pretrained(folder, gguf_file=name)
    except (FileNotFoundError, ImportError) as e:
        print(f"[engine check] SmolLM2's tokenizer is not here ({e}): the tiny model's", flush=True)
        tok = AutoTokenizer.from_pretrained(prepare("tiny"))
    tok.pad_token = tok.eos_token
    torch.manual_seed(seed)
    cfg = LlamaConfig(
        **SMOLLM2_SHAPE,
        bos_token_id=tok.bos_token_id,
        eos_token_id=tok.eos_token_id,
        pad_token_id=tok.eos_token_id,
    )
    os.makedirs(out_dir, exist_ok=True)
    tok.save_pretrained(out_dir)
    LlamaForCausalLM(cfg).to(torch.bfloat16).save_pretrained(out_dir)
    return out_dir


def resolve_model(name: str) -> str:
    """``tiny`` / ``smollm2`` (``cpu.models.prepare``), ``smollm2-shape`` (:func:`smollm2_shape`), or a folder."""
    if name in ("tiny", "smollm2"):
        from avspo_openrlhf.cpu.models import prepare

        return prepare(name)
    if name == "smollm2-shape":
        return smollm2_shape()
    if not Path(name, "config.json").is_file():
        raise FileNotFoundError(f"--model: {name} is not tiny, smollm2, smollm2-shape or an HF folder")
    return name


def load_study(path: str):
    """The ``STUDY`` a study script defines (``experiments/remedies_gpu/run.py``): its settings and arms."""
    return runpy.run_path(path)["STUDY"]


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--model", default="smollm2-shape", help="tiny | smollm2 | smollm2-shape | an HF folder")
    p.add_argument("--dtype", choices=("fp32", "bf16"), help="compute precision (default: bf16 on CUDA, else fp32)")
    p.add_argument("--out", required=True, help="the result as JSON")
    p.add_argument(
        "--study",
        default="experiments/remedies_gpu/run.py",
        help="a study script whose STUDY gives the settings and arms (default: the GPU study's)",
    )
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--threads", type=int, default=0, help="torch CPU threads (0: torch's default)")
    args = p.parse_args(argv)
    if args.threads:
        torch.set_num_threads(args.threads)
    study_file = Path(args.study)
    if not study_file.is_file():
        study_file = Path(__file__).resolve().parents[2] / args.study
    if not study_file.is_file():
        p.error(f"--study: no such file: {args.study}")
    study = load_study(str(study_file))
    dtype = args.dtype or ("bf16" if torch.cuda.is_available() else "fp32")
    settings = dataclasses.replace(study.settings, dtype=dtype)
    result = check_engines(resolve_model(args.model), settings, dict(study.arms), seed=args.seed)
    Path(args.out).parent.mkdir(parents=True, exist_ok=True)
    Path(args.out).write_text(json.dumps(result, indent=1), encoding="utf-8")
    print(table(result), flush=True)
    return 0 if result["ok"] else 1


if __name__ == "__main__":
    sys.exit(main())
