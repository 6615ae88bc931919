"""Replay of the first GPU pilot's GRPO seed 0 with the code it ran (74a1dc5), to name the non-finite
gradient norm that stopped it at step 35 (README.md, History; the result of the replay on an H200 is
results/replay_step35.json). The old code's Run._update is wrapped: when the gradient norm is not
finite, the batch is diagnosed (which module's output first goes non-finite, the log-probs, the
gradients of each micro-batch and of each row alone, an fp32 recomputation, the on-policy logits / T
loss) and saved as batch35.pt.

    git archive 74a1dc5 avspo_openrlhf experiments/remedies_gpu/run.py | tar -x -C OLD
    python experiments/remedies_gpu/replay_step35.py OLD OUTDIR [STEPS]     # on a GPU, with the SmolLM2 GGUF

On a CPU the run samples other random numbers than on CUDA, so it does not reach the same batch.
REPLAY_MODEL=tiny REPLAY_FORCE_NAN_AT=2 checks the script itself on a CPU (a planted NaN).
"""

import importlib.util
import json
import os
import sys
import time
from pathlib import Path

OLD = Path(sys.argv[1]).resolve()
sys.path.insert(0, str(OLD))

import torch  # noqa: E402

import avspo_openrlhf  # noqa: E402

assert str(OLD) in avspo_openrlhf.__file__, avspo_openrlhf.__file__
from avspo_openrlhf.study import loop as old  # noqa: E402

OUT = Path(sys.argv[2])
OUT.mkdir(parents=True, exist_ok=True)
MAX_STEPS = int(sys.argv[3]) if len(sys.argv) > 3 else 40
REPORT: dict = {"steps": []}


def dump():
    (OUT / "replay35.json").write_text(json.dumps(REPORT, indent=1, default=str))


def nonfinite(t):
    return t is not None and not bool(torch.isfinite(t).all())


def diagnose(run, ro, adv, rewards):
    s = run.spec.settings
    pol = run.policy
    m = pol.model
    d: dict = {"step": run.state["step"] + 1}
    bad = [
        (n, float(p.grad.float().abs().nan_to_num(posinf=1e38).max()))
        for n, p in m.named_parameters()
        if p.grad is not None and nonfinite(p.grad)
    ]
    d["params_nonfinite_grad"] = [n for n, _ in bad][:20]
    d["n_params_nonfinite_grad"] = len(bad)
    d["n_params"] = sum(1 for _ in m.parameters())
    d["params_nonfinite"] = [n for n, p in m.named_parameters() if nonfinite(p.data)][:10]
    width_c = ro.mask.shape[1]
    d["shape"] = list(ro.ids.shape)
    d["width_c"] = width_c
    attn = ro.attn
    d["completion_lengths"] = ro.mask.sum(1).tolist()
    d["prompt_lengths"] = attn[:, : attn.shape[1] - width_c].sum(1).tolist()
    d["rewards"] = rewards.reshape(-1).tolist()
    d["adv"] = adv.reshape(-1).tolist()
    d["texts_sample"] = ro.texts[:64]
    torch.save(
        {"ids": ro.ids.cpu(), "attn": ro.attn.cpu(), "mask": ro.mask.cpu(), "adv": adv.cpu(), "rewards": rewards.cpu()},
        OUT / "batch35.pt",
    )
    # which micro-batch, which module first produces a non-finite output (forward hooks)
    mb = []
    first: list = []

    def hook(name):
        def f(mod, inp, out):
            o = out[0] if isinstance(out, tuple) else out
            if torch.is_tensor(o) and nonfinite(o) and not first:
                rows = (~torch.isfinite(o.float())).reshape(o.shape[0], -1).any(-1).nonzero().flatten().tolist()
                first.append({"module": name, "rows_in_micro_batch": rows[:16], "dtype": str(o.dtype)})

        return f

    hs = [mod.register_forward_hook(hook(n)) for n, mod in m.named_modules()]
    mask = ro.mask.float()
    total = mask.sum().clamp_min(1.0)
    a_all = adv.reshape(-1).to(pol.device)
    for i in range(0, ro.ids.shape[0], s.micro_batch):
        sl = slice(i, i + s.micro_batch)
        first.clear()
        m.zero_grad(set_to_none=True)
        lp, ent = pol.logprobs_entropy(ro.ids[sl], ro.attn[sl], width_c, True)
        mm = mask[sl]
        loss = -(a_all[sl, None].expand_as(lp) * lp * mm).sum() / total
        loss.backward()
        gbad = [n for n, p in m.named_parameters() if p.grad is not None and nonfinite(p.grad)]
        lpm = lp.detach()
        row = {
            "micro_batch": i // s.micro_batch,
            "rows": [sl.start, min(sl.stop, ro.ids.shape[0])],
            "loss": float(loss.detach()),
            "lp_nonfinite_in_mask": int((~torch.isfinite(lpm) & (mm > 0)).sum()),
            "lp_nonfinite_off_mask": int((~torch.isfinite(lpm) & (mm == 0)).sum()),
            "lp_min_in_mask": float(lpm.masked_fill(mm == 0, 0).nan_to_num(0).min()),
            "ent_nonfinite": int((~torch.isfinite(ent)).sum()),
            "first_nonfinite_forward": list(first),
            "grad_nonfinite_params": gbad[:8],
            "n_grad_nonfinite": len(gbad),
        }
        if gbad:
            # fp32, no autocast, on the same rows
            m.zero_grad(set_to_none=True)
            with torch.autocast(pol.device.type, enabled=False):
                pos = (ro.attn[sl].cumsum(-1) - 1).clamp_min(0)
                lg = (
                    m(input_ids=ro.ids[sl], attention_mask=ro.attn[sl], position_ids=pos, logits_to_keep=width_c + 1)
                    .logits[:, :-1]
                    .float()
                )
            lp32 = lg.gather(-1, ro.ids[sl][:, -width_c:, None]).squeeze(-1) - torch.logsumexp(lg, -1)
            (-(a_all[sl, None] * lp32 * mm).sum() / total).backward()
            row["fp32_grad_nonfinite"] = sum(1 for p in m.parameters() if p.grad is not None and nonfinite(p.grad))
            # the same rows one at a time (bf16): which sequence
            per_row = []
            for r in range(sl.start, min(sl.stop, ro.ids.shape[0])):
                first.clear()
                m.zero_grad(set_to_none=True)
                lpr, _ = pol.logprobs_entropy(ro.ids[r : r + 1], ro.attn[r : r + 1], width_c, False)
                (-(a_all[r] * lpr * mask[r : r + 1]).sum() / total).backward()
                nb = sum(1 for p in m.parameters() if p.grad is not None and nonfinite(p.grad))
                if nb or first:
                    per_row.append(
                        {
                            "row": r,
                            "n_grad_nonfinite": nb,
                            "first_nonfinite_forward": list(first),
                            "completion_len": int(ro.mask[r].sum()),
                            "prompt_len": int(ro.attn[r, :-width_c].sum()),
                            "text": ro.texts[r],
                            "adv": float(a_all[r]),
                            "ids_tail": ro.ids[r, -width_c:].tolist(),
                            "attn_tail": ro.attn[r, -width_c:].tolist(),
                        }
                    )
            row["rows_alone"] = per_row
            # on-policy log-probs (logits / T), the corrected loop's loss, bf16
            m.zero_grad(set_to_none=True)
            with pol.autocast():
                pos = (ro.attn[sl].cumsum(-1) - 1).clamp_min(0)
                lg = (
                    m(input_ids=ro.ids[sl], attention_mask=ro.attn[sl], position_ids=pos, logits_to_keep=width_c + 1)
                    .logits[:, :-1]
                    .float()
                    / s.temperature
                )
            lpT = lg.gather(-1, ro.ids[sl][:, -width_c:, None]).squeeze(-1) - torch.logsumexp(lg, -1)
            (-(a_all[sl, None] * lpT * mm).sum() / total).backward()
            row["onpolicy_T_grad_nonfinite"] = sum(
                1 for p in m.parameters() if p.grad is not None and nonfinite(p.grad)
            )
        mb.append(row)
    for h in hs:
        h.remove()
    d["micro_batches"] = mb
    m.zero_grad(set_to_none=True)
    return d


orig_update = old.Run._update
orig_step = old.Run.step


def update(self, ro, adv, rewards):
    try:
        out = orig_update(self, ro, adv, rewards)
    except FloatingPointError as e:
        REPORT["failure"] = str(e)
        REPORT["diagnosis"] = diagnose(self, ro, adv, rewards)
        dump()
        raise
    REPORT["steps"].append(
        {
            "step": self.state["step"] + 1,
            "grad_norm": out["grad_norm"],
            "loss": out["loss"],
            "entropy": out["entropy"],
            "width_c": ro.mask.shape[1],
            "mean_len": float(ro.mask.float().sum(1).mean()),
        }
    )
    if self.state["step"] + 1 >= MAX_STEPS:
        dump()
        raise SystemExit(0)
    return out


old.Run._update = update

spec_ = importlib.util.spec_from_file_location("old_run", OLD / "experiments/remedies_gpu/run.py")
mod = importlib.util.module_from_spec(spec_)
spec_.loader.exec_module(mod)
study = mod.STUDY
data = study.make_data(OUT / "data")
from avspo_openrlhf.cpu.models import prepare  # noqa: E402

model = prepare(os.environ.get("REPLAY_MODEL", "smollm2"))
FORCE = int(os.environ.get("REPLAY_FORCE_NAN_AT", "0"))
if FORCE:  # a check of this script on a CPU: a NaN planted in one gradient at that step
    _clip = torch.nn.utils.clip_grad_norm_
    _n = {"calls": 0}

    def clip(params, *a, **k):
        params = list(params)
        _n["calls"] += 1
        if _n["calls"] == FORCE:
            params[5].grad.view(-1)[0] = float("nan")
        return _clip(params, *a, **k)

    torch.nn.utils.clip_grad_norm_ = clip
spec = study.spec("GRPO", 0, model, data)
REPORT["device"] = torch.cuda.get_device_name() if torch.cuda.is_available() else "cpu"
REPORT["torch"] = torch.__version__
t0 = time.time()
try:
    old.run(spec, OUT / "GRPO_seed0", log=lambda s: print(s, flush=True))
except FloatingPointError as e:
    print("REPLAY FAILED AS ON THE PILOT:", e, flush=True)
finally:
    REPORT["wall_s"] = time.time() - t0
    dump()
