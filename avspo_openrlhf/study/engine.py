"""K runs of a study in one process, their weights stacked (``study/stacked.py``): each run is the
study loop's own :class:`~avspo_openrlhf.study.loop.Run` (its controller, prompt stream, GRESO, rewards,
checkpoints, result), and what needs the model is served for all of them at once.

A run's logic is a generator of requests (``Run.life_g``): :class:`~avspo_openrlhf.study.protocol.Generate`
and :class:`~avspo_openrlhf.study.protocol.Update`. The engine collects the pending request of every live
run; while any run asks to generate, it serves every generation request in one batched generation
(runs with fewer sequences get filler rows, ended from the start); when every live run asks for an
update, one batched forward and backward, and one per-run AdamW step. So the runs advance in lockstep:
a DAPO-DS run that refills waits for no one, and the runs that need no refill wait for its rounds; a
run that ends early (its budget reached) leaves its slot empty. Every arm keeps its semantics: the
requests are the same the process-per-run engine serves; a run's sampling draws come from its own
(seed, step, round) generator, so which runs share a batch changes floating-point rounding only.

A run that raises (a reward out of range, a bad row) is written to its ``log.txt`` with its traceback
and leaves the batch; the others go on. Each run checkpoints and resumes on its own: a batch started
again continues every run from its checkpoint.

    python -m avspo_openrlhf.study.engine [--threads N] SPEC.json RUN_DIR [SPEC.json RUN_DIR ...]
"""

from __future__ import annotations

import argparse
import contextlib
import json
import sys
import time
import traceback
from pathlib import Path

import torch

from avspo_openrlhf.study import stacked
from avspo_openrlhf.study.hf_engine import Policy
from avspo_openrlhf.study.loop import Run, note_failure, own_error
from avspo_openrlhf.study.objective import diagnosis, masked_finite, policy_loss, token_logprobs_entropy
from avspo_openrlhf.study.protocol import Generate, Update
from avspo_openrlhf.study.spec import RunSpec


class RunView:
    """What a :class:`Run` reads of its engine, for run ``k`` of a :class:`StackedEngine`."""

    def __init__(self, engine: StackedEngine, k: int):
        self.engine, self.k = engine, k
        self.policy = engine.shell

    @property
    def batch(self) -> dict:
        """What shared the device with this run (its result records it: a wall time is an arm's cost only
        beside runs of its own arm)."""
        methods = sorted({spec.method for spec in self.engine.specs})
        return {"engine": "stacked", "runs_at_once": len(self.engine.specs), "methods": methods}

    def model_state(self) -> dict:
        return stacked.unstack(self.engine.params, self.k)

    def optimizer_state(self) -> dict:
        return self.engine.opt.state_of(self.k)

    def load_states(self, model: dict, optimizer: dict) -> None:
        with torch.no_grad():
            for name, p in self.engine.params.items():
                p[self.k].copy_(model[name].to(p.device, p.dtype))
        self.engine.opt.load_state_of(self.k, optimizer)


class StackedEngine:
    """K runs with one model and one settings (arm, seed and learning rate may differ)."""

    def __init__(self, specs: list[RunSpec], dirs: list[Path], log=print):
        if not specs:
            raise ValueError("the stacked engine needs at least one run")
        first = specs[0]
        for spec in specs:
            if spec.settings != first.settings or spec.model != first.model:
                raise ValueError(
                    f"{spec.method} seed {spec.seed}: the runs of one batch share the model and the "
                    "settings (arm, seed and lr may differ)"
                )
        self.specs = specs
        s = self.settings = first.settings
        if s.engine != "stacked":
            raise ValueError(f"StudySettings.engine is {s.engine!r}: these runs are the process engine's")
        from transformers import AutoModelForCausalLM

        self.shell = Policy(first.model, s, load_model=False)
        model = AutoModelForCausalLM.from_pretrained(first.model, dtype=torch.float32)
        self.cfg = stacked.StackedConfig.from_hf(model.config)
        state = model.state_dict()
        buffers = {n for n, _ in model.named_buffers()}  # rotary frequencies: computed, not weights
        unread = stacked.unread_params([n for n in state if n not in buffers], self.cfg)
        if unread:
            raise ValueError(
                f"{first.model}: the stacked engine's forward does not read {len(unread)} of its parameters "
                f"(first: {', '.join(unread[:5])}); it would train without them"
            )
        del model
        self.params = stacked.stack([state] * len(specs), self.cfg, self.shell.device)
        lrs = torch.tensor([spec.arm.lr if spec.arm.lr is not None else s.lr for spec in specs])
        self.opt = stacked.StackedAdamW(self.params, lrs)
        self.log = log
        self.runs: dict[int, Run] = {}
        self.dirs = [Path(d) for d in dirs]
        self.failed: dict[int, str] = {}
        # wall seconds and calls of the two batched phases (the rest is the runs' own Python: rewards,
        # advantages, checkpoints): where a GPU's time goes, for the throughput table's reader
        self.timing = {"generate_s": 0.0, "generate_calls": 0, "update_s": 0.0, "update_calls": 0}
        for k, (spec, d) in enumerate(zip(specs, self.dirs)):
            try:
                self.runs[k] = Run(spec, d, engine=RunView(self, k))
            except Exception:
                self._fail(k, spec)

    def _fail(self, k: int, spec: RunSpec) -> None:
        text = traceback.format_exc()
        self.failed[k] = text.strip().splitlines()[-1]
        self.dirs[k].mkdir(parents=True, exist_ok=True)
        with open(self.dirs[k] / "log.txt", "a", encoding="utf-8") as f:
            f.write(text)
        if own_error(sys.exc_info()[1]):  # not the machine's (out of memory, a device error): a study's rule counts it
            note_failure(self.dirs[k], self.failed[k])
        self.log(f"[{spec.method} seed {spec.seed}] failed: {self.failed[k]}")
        self.runs.pop(k, None)

    def _run_log(self, k: int, spec: RunSpec):
        def log(line: str) -> None:
            text = f"[{spec.method} seed {spec.seed}] {line}"
            with open(self.dirs[k] / "log.txt", "a", encoding="utf-8") as f:
                f.write(text + "\n")
            self.log(text)

        return log

    # ── the batch ──

    def run(self) -> dict[int, dict]:
        """Every run to its result (those already finished are read back); returns ``{k: result}``."""
        results, lives, pending = {}, {}, {}
        for k, r in list(self.runs.items()):
            if (r.dir / "result.json").exists():
                results[k] = json.loads((r.dir / "result.json").read_text(encoding="utf-8"))
                continue
            lives[k] = r.life_g(self._run_log(k, r.spec))
            self._advance(k, lives, pending, results, None)
        while pending:
            gen = {k: q for k, q in pending.items() if isinstance(q, Generate)}
            phase = "generate" if gen else "update"
            t0 = time.perf_counter()
            answers = self._generate(gen) if gen else self._update(pending)
            if self.shell.device.type == "cuda":
                torch.cuda.synchronize()
            self.timing[f"{phase}_s"] += time.perf_counter() - t0
            self.timing[f"{phase}_calls"] += 1
            for k in self.failed:  # a run that failed in the batched call has no answer and asks no more
                pending.pop(k, None)
            for k, answer in answers.items():
                self._advance(k, lives, pending, results, answer)
        return results

    def _advance(self, k: int, lives: dict, pending: dict, results: dict, answer) -> None:
        pending.pop(k, None)
        try:
            pending[k] = next(lives[k]) if answer is None else lives[k].send(answer)
        except StopIteration as done:
            results[k] = done.value
        except Exception:
            self._fail(k, self.runs[k].spec)

    # ── generation ──

    @torch.no_grad()
    def _generate(self, requests: dict[int, Generate]) -> dict[int, object]:
        """Every run's generation request in batched calls (per temperature and length; ``batch``
        sequences of each run per call), each run's draws from its own seed."""
        out: dict[int, object] = {}
        groups: dict[tuple, list[int]] = {}
        for k, q in requests.items():
            groups.setdefault((q.max_new_tokens, q.temperature), []).append(k)
        for (T, temperature), ks in groups.items():
            enc, uniforms = {}, {}
            for k in ks:
                q = requests[k]
                try:  # a request this run's data makes bad (a problem that cannot be encoded) is its failure alone
                    ids, attn = self.shell.encode(q.problems)
                    enc[k] = (ids.repeat_interleave(q.n, 0), attn.repeat_interleave(q.n, 0))
                    uniforms[k] = stacked.draw_uniforms(q.seed, enc[k][0].shape[0], T)
                except Exception:
                    self._fail(k, self.runs[k].spec)
            ks = [k for k in ks if k in enc]
            if not ks:
                continue
            parts = {k: [] for k in ks}
            step = min(requests[k].batch for k in ks)
            longest = max(enc[k][0].shape[0] for k in ks)
            for start in range(0, longest, step):
                live = [k for k in ks if enc[k][0].shape[0] > start]
                rows = {k: slice(start, min(start + step, enc[k][0].shape[0])) for k in live}
                B = max(rows[k].stop - rows[k].start for k in live)
                Lp = max(enc[k][0].shape[1] for k in live)
                ids = torch.full((len(live), B, Lp), self.shell.tok.pad_token_id, dtype=torch.long)
                attn = torch.zeros(len(live), B, Lp, dtype=torch.long)
                real = torch.zeros(len(live), B, dtype=torch.bool)
                u = torch.zeros(len(live), B, T)
                for i, k in enumerate(live):
                    p, a = enc[k][0][rows[k]], enc[k][1][rows[k]]
                    ids[i, : p.shape[0], Lp - p.shape[1] :] = p.cpu()
                    attn[i, : p.shape[0], Lp - p.shape[1] :] = a.cpu()
                    real[i, : p.shape[0]] = True
                    u[i, : p.shape[0]] = uniforms[k][rows[k]]
                comp = stacked.generate(
                    self._params_of(live),
                    self.cfg,
                    ids.to(self.shell.device),
                    attn.to(self.shell.device),
                    u.to(self.shell.device),
                    temperature,
                    self.shell.eos_ids,
                    self.shell.tok.pad_token_id,
                    autocast_dtype=self._autocast(),
                    rows=real,
                )
                for i, k in enumerate(live):
                    n = rows[k].stop - rows[k].start
                    parts[k].append((enc[k][0][rows[k]], enc[k][1][rows[k]], comp[i, :n]))
            for k in ks:
                try:
                    out[k] = self.shell.rollout(parts[k])
                except Exception:
                    self._fail(k, self.runs[k].spec)
        return out

    def _params_of(self, ks: list[int]) -> dict[str, torch.Tensor]:
        """The stacked weights of runs ``ks``: all of them as they are, a subset gathered (with grad)."""
        if ks == list(range(len(self.dirs))):
            return self.params
        idx = torch.tensor(ks, device=self.shell.device)
        return {n: p[idx] for n, p in self.params.items()}

    def _autocast(self) -> torch.dtype | None:
        return None if self.shell.dtype == torch.float32 else self.shell.dtype

    # ── the update ──

    def _update(self, requests: dict[int, Update]) -> dict[int, dict]:
        """One batched forward and backward over every updating run's batch (micro-batched over its
        sequences), then one per-run AdamW step: each run's loss is - mean over its completion tokens
        of A * log pi_T, its gradient clipped on its own, its step skipped when its gradient or its
        completion-token entropies are not finite (then without token advantages: RL-ZVP's raise on
        them). A run whose own part raises (its rows, its token advantages, its metrics) fails alone."""
        s = self.settings
        rows = {}
        for k in sorted(requests):
            q = requests[k]
            try:  # this run's rows on the CPU: ids, attn [b, Lp_k + Tc_k], mask [b, Tc_k], adv [b], sign [b]
                r, b = q.ro, q.ro.ids.shape[0]
                adv_k = q.adv.reshape(-1).cpu().float()
                sign_k = torch.zeros(b, dtype=torch.int8) if q.sign is None else q.sign.reshape(-1).cpu().to(torch.int8)
                if r.attn.shape != r.ids.shape or r.mask.shape[0] != b or len(adv_k) != b or len(sign_k) != b:
                    raise ValueError(
                        f"Update: ro.ids {tuple(r.ids.shape)}, ro.attn {tuple(r.attn.shape)}, ro.mask "
                        f"{tuple(r.mask.shape)}, adv {tuple(q.adv.shape)} and sign {tuple(sign_k.shape)} do not match"
                    )
                rows[k] = (r.ids.cpu(), r.attn.cpu(), r.mask.cpu().float(), adv_k, sign_k)
            except Exception:
                self._fail(k, self.runs[k].spec)
        ks = sorted(rows)
        if not ks:
            return {}
        R = len(ks)
        Lp = max(r[0].shape[1] - r[2].shape[1] for r in rows.values())
        Tc = max(r[2].shape[1] for r in rows.values())
        B = max(r[0].shape[0] for r in rows.values())
        pad = self.shell.tok.pad_token_id
        ids = torch.full((R, B, Lp + Tc), pad, dtype=torch.long)
        attn = torch.zeros(R, B, Lp + Tc, dtype=torch.long)
        mask = torch.zeros(R, B, Tc)
        adv = torch.zeros(R, B)
        sign = torch.zeros(R, B, dtype=torch.int8)
        for i, k in enumerate(ks):
            r_ids, r_attn, r_mask, r_adv, r_sign = rows[k]
            (b, tc_k), lp_k = r_mask.shape, r_ids.shape[1] - r_mask.shape[1]
            ids[i, :b, Lp - lp_k : Lp + tc_k] = r_ids
            attn[i, :b, Lp - lp_k : Lp + tc_k] = r_attn
            mask[i, :b, :tc_k] = r_mask
            adv[i, :b], sign[i, :b] = r_adv, r_sign
        dev = self.shell.device
        ids, attn, mask, adv = ids.to(dev), attn.to(dev), mask.to(dev), adv.to(dev)
        pos = (attn.cumsum(-1) - 1).clamp_min(0)
        totals = mask.sum((1, 2)).clamp_min(1.0)
        ctrls = {i: self.runs[k].controller for i, k in enumerate(ks)}
        token_runs = [i for i, c in ctrls.items() if c.needs_entropy]
        acc = {"loss": torch.zeros(R), "ent": torch.zeros(R), "tok": torch.zeros(R)}
        finite = {
            "loss": torch.ones(R, dtype=torch.bool),
            "lp": torch.ones(R, dtype=torch.bool),
            "ent": torch.ones(R, dtype=torch.bool),
        }
        self.opt.zero_grad()
        ctx = torch.autocast(dev.type, dtype=self.shell.dtype) if self._autocast() else contextlib.nullcontext()
        for start in range(0, B, s.micro_batch):
            sl = slice(start, start + s.micro_batch)
            params = self._params_of(ks)
            with ctx:
                logits = stacked.forward(params, self.cfg, ids[:, sl], attn[:, sl], pos[:, sl], keep=Tc + 1)[:, :, :-1]
            lp, ent = token_logprobs_entropy(logits, ids[:, sl, -Tc:], s.temperature, True)
            m = mask[:, sl]
            finite["ent"] &= masked_finite(ent, m).cpu()
            a = adv[:, sl, None].expand_as(lp).clone()
            for i in token_runs:
                if not finite["ent"][i] or ks[i] in self.failed:  # its step is skipped, or it has failed
                    continue
                try:
                    extra = ctrls[i].token_advantages(ent[i], m[i], sign[i, sl].to(ent.device))
                except Exception:
                    self._fail(ks[i], self.runs[ks[i]].spec)
                    continue
                a[i] = a[i] + extra
                acc["tok"][i] += float((extra.abs() * m[i]).sum())
            # every op is per run, so each run's weights get the gradient of its own loss alone: a run's
            # NaN stays in its own gradient (and its step is skipped)
            per_run = policy_loss(lp, a, m, totals)
            per_run.sum().backward()
            acc["loss"] += per_run.detach().float().cpu()
            acc["ent"] += torch.where(m > 0, ent, 0.0).sum((1, 2)).float().cpu()
            finite["loss"] &= torch.isfinite(per_run.detach()).cpu()
            finite["lp"] &= masked_finite(lp.detach(), m).cpu()
        active = torch.zeros(len(self.dirs), dtype=torch.bool)
        active[ks] = finite["ent"] & torch.tensor([k not in self.failed for k in ks])
        norms, stepped = self.opt.step(s.grad_clip, active)
        out = {}
        for i, k in enumerate(ks):
            if k in self.failed:
                continue
            try:
                o = {
                    "loss": float(acc["loss"][i]),
                    "entropy": float(acc["ent"][i] / totals[i].cpu()),
                    "grad_norm": float(norms[k]),
                    "update_skipped": int(not stepped[k]),
                }
                if ctrls[i].needs_entropy:
                    o["token_adv_abs_mean"] = float(acc["tok"][i] / totals[i].cpu())
                if not stepped[k]:
                    bad = [
                        n for n, p in self.params.items() if p.grad is not None and not torch.isfinite(p.grad[k]).all()
                    ]
                    o["diagnosis"] = diagnosis(finite["loss"][i], finite["lp"][i], finite["ent"][i], bad)
                out[k] = o
            except Exception:
                self._fail(k, self.runs[k].spec)
        self.opt.zero_grad()
        return out


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("pairs", nargs="+", help="SPEC.json RUN_DIR, once per run (RunSpec.to_json; rerun to resume)")
    p.add_argument("--threads", type=int, default=0, help="torch CPU threads (0: torch's default)")
    args = p.parse_args(argv)
    if len(args.pairs) % 2:
        p.error("give SPEC.json RUN_DIR pairs")
    if args.threads:
        torch.set_num_threads(args.threads)
    specs = [RunSpec.from_json(Path(f).read_text(encoding="utf-8")) for f in args.pairs[0::2]]
    dirs = [Path(d) for d in args.pairs[1::2]]
    t0 = time.perf_counter()
    engine = StackedEngine(specs, dirs, log=lambda line: print(line, flush=True))
    results = engine.run()
    for k, res in sorted(results.items()):
        pass1 = res["heldout_pass1"]
        print(
            f"[{specs[k].method} seed {specs[k].seed}] done: {res['steps']} steps, {res['generated_tokens']} tokens, "
            f"held-out pass@1 {'-' if pass1 is None else f'{100 * pass1:.1f} %'}",
            flush=True,
        )
    wall = time.perf_counter() - t0
    t = engine.timing
    print(
        f"[stacked] {len(results)} of {len(specs)} runs done in {wall:.1f} s: batched generation "
        f"{t['generate_s']:.1f} s ({t['generate_calls']} calls), batched update {t['update_s']:.1f} s "
        f"({t['update_calls']} calls), the rest {wall - t['generate_s'] - t['update_s']:.1f} s",
        flush=True,
    )
    return 1 if engine.failed else 0


if __name__ == "__main__":
    sys.exit(main())
