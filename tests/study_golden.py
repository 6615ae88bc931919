"""What the frozen GPU study computes, on a CPU in fp32: every arm of ``experiments/remedies_gpu/run.py``
for two seeds and a few steps, on the tiny model, through the stacked engine (the study's), as one JSON
of what each run sampled, scored, trained and evaluated. ``tests/test_study_frozen.py`` runs this file
against the frozen commit's tree and against this checkout, in separate processes, on the same model and
data, and compares: main may change how the study's code is written, not what it computes, unless it
bumps ``LOOP_SEMANTICS`` (and the study freezes anew).

    python tests/study_golden.py STUDY_FILE MODEL TRAIN HELDOUT OUT.json     # with PYTHONPATH = the tree
"""

from __future__ import annotations

import dataclasses
import importlib.util
import json
import sys
import tempfile
from pathlib import Path

# what a run's record holds that is not a number of its computation (clocks, machine, code identity)
NOT_COMPUTED = {"train_s", "eval_s", "device", "commit", "code", "settings", "settings_hash", "torch", "batch"}


def load_study(path: str):
    spec = importlib.util.spec_from_file_location("frozen_study_file", path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module.STUDY


def main(study_file: str, model: str, train: str, heldout: str, out: str) -> int:
    import torch

    from avspo_openrlhf.study.engine import StackedEngine

    try:
        from avspo_openrlhf.study.spec import RunSpec
    except ImportError:  # the frozen tree, before the study loop was split by concern
        from avspo_openrlhf.study.loop import RunSpec

    torch.set_num_threads(1)  # one reduction order in both processes
    study = load_study(study_file)
    small = dataclasses.replace(
        study.settings,
        group_size=4,
        prompts_per_step=3,
        max_new_tokens=8,
        lr=1e-3,  # the tiny random model moves visibly in a few steps
        token_budget=200,
        reward="study_reward:half_collapsed",
        eval_n=2,
        mid_eval_tokens=100,
        mid_eval_problems=4,
        ckpt_every=0,
        micro_batch=8,
        gen_batch=32,
        engine="stacked",
    )
    # the format control reads the task's answer extraction: arith's, in a batch of its own settings
    batches = [
        (small, [a for a in study.arms if study.arms[a].reward != "format"]),
        (dataclasses.replace(small, reward="arith"), [a for a in study.arms if study.arms[a].reward == "format"]),
    ]
    records = {}
    with tempfile.TemporaryDirectory() as tmp:
        for settings, arms in batches:
            specs = [
                RunSpec(
                    method=a, seed=s, arm=study.arms[a], settings=settings, model=model, train=train, heldout=heldout
                )
                for a in arms
                for s in (0, 1)
            ]
            dirs = [Path(tmp) / f"{sp.method}_seed{sp.seed}" for sp in specs]
            results = StackedEngine(specs, dirs, log=lambda _: None).run()
            if len(results) != len(specs):
                raise SystemExit(f"runs failed: {sorted(set(range(len(specs))) - set(results))}")
            for k, r in results.items():
                rec = {key: v for key, v in r.items() if key not in NOT_COMPUTED}
                rec["curve"] = [{key: v for key, v in c.items() if key != "wall_s"} for c in r["curve"]]
                records[f"{specs[k].method}_seed{specs[k].seed}"] = rec
    import avspo_openrlhf

    records["_package"] = str(Path(avspo_openrlhf.__file__).resolve().parent)  # which tree computed them
    Path(out).write_text(json.dumps(records, indent=1, sort_keys=True), encoding="utf-8")
    return 0


if __name__ == "__main__":
    sys.exit(main(*sys.argv[1:]))
