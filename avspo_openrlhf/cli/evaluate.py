"""``avspo-eval`` (also ``python -m eval``): pass@1 / pass@k / maj@n on the paper's benchmarks.

avspo-eval --model Qwen/Qwen2.5-Math-1.5B                     # every benchmark found in data/
avspo-eval --run-dir runs/level3_avspo --benchmarks math500   # every checkpoint of a run + PNG
avspo-eval --oracle --data math500=raw/math500.jsonl  # reference solutions: 100 %
avspo-eval --completions outs.jsonl --benchmarks gsm8k        # score existing outputs
"""

from __future__ import annotations

import argparse
import json
import os
import sys
from pathlib import Path

from avspo_openrlhf import startup_gc
from avspo_openrlhf.cli.preflight import check_model
from avspo_openrlhf.cpu.dtype import CPU_DTYPES
from avspo_openrlhf.folder_lock import FolderBusy, lock_folder
from avspo_openrlhf.math_eval.generators import Decoding, FileGenerator, OracleGenerator, VLLMGenerator
from avspo_openrlhf.math_eval.runner import (
    ALL,
    BENCHMARKS,
    evaluate_model,
    find_checkpoints,
    find_data,
    load_benchmark,
    model_identity,
    plot_steps,
    verification_line,
    write_eval_mix,
)

DEFAULT_DATA_DIRS = ["data", os.path.join("..", "shared", "data")]


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(
        allow_abbrev=False,
        prog="avspo-eval",
        description="Evaluate a model or a run's checkpoints on MATH-500, GSM8K, Minerva, OlympiadBench, AMC, "
        "AIME24 and MMLU-Pro; prints the paper-layout table. Resumable.",
        formatter_class=argparse.ArgumentDefaultsHelpFormatter,
    )
    src = p.add_mutually_exclusive_group(required=True)
    src.add_argument("--model", help="HF model folder or hub id")
    src.add_argument("--run-dir", help="an OpenRLHF run folder: evaluates every HF checkpoint in it (skips done ones)")
    src.add_argument("--completions", help="jsonl of existing outputs (unique_id/problem + completions): score only")
    src.add_argument("--oracle", action="store_true", help="use reference solutions as completions (checks scoring)")
    src.add_argument("--make-train-eval", metavar="PATH", help="write one jsonl for OpenRLHF's --eval.dataset and exit")
    p.add_argument(
        "--benchmarks",
        nargs="+",
        default=[b.name for b in BENCHMARKS],
        choices=[b.name for b in ALL],
        help="'arith' is the CPU quickstart's held-out synthetic arithmetic (not in the paper's table)",
    )
    p.add_argument(
        "--data-dir", action="append", help=f"folders holding <benchmark>.jsonl (default: {DEFAULT_DATA_DIRS})"
    )
    p.add_argument(
        "--data",
        action="append",
        default=[],
        metavar="NAME=PATH",
        help="file for one benchmark (prepared or hub format)",
    )
    p.add_argument(
        "--backend", choices=["vllm", "vllm-cpu"], default=None, help="default: vllm with a GPU, else vllm-cpu"
    )
    p.add_argument(
        "--cpu-dtype",
        choices=CPU_DTYPES,
        default="auto",
        help="vllm-cpu dtype; auto: fp32 for weights stored in fp32/fp16 (config.json; every model the CPU trainer "
        "saves in fp32), else bf16 where the CPU has native bf16 (AVX512-BF16, AMX, Arm BF16), else fp32. The table "
        "footer and summary.json name the precision used",
    )
    p.add_argument("--tp", type=int, default=1, help="tensor-parallel GPUs per engine")
    p.add_argument("--dp", type=int, default=1, help="data-parallel engines (GPU)")
    p.add_argument("--gpu-memory-utilization", type=float, default=0.9)
    p.add_argument("--max-model-len", type=int, default=None)
    p.add_argument("--n", type=int, default=1, help="samples per problem (pass@1 = mean over them, avg@n)")
    p.add_argument("--temperature", type=float, default=0.1, help="the paper's pass@1 setting")
    p.add_argument("--greedy", action="store_true", help="temperature 0, n 1")
    p.add_argument("--top-p", type=float, default=1.0)
    p.add_argument("--max-new-tokens", type=int, default=2048)
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--k", type=int, nargs="+", default=None, help="pass@k values (default: 1 and powers of 2 up to n)")
    p.add_argument(
        "--template", choices=["paper", "plain", "none"], default="paper", help="prompt template for raw files"
    )
    p.add_argument("--system-prompt", default=None, help="replace the system prompt ('' removes it)")
    p.add_argument("--no-chat-template", action="store_true", help="join messages as plain text (base models)")
    p.add_argument("--output", default=None, help="results folder (default: eval_results/<model name>)")
    p.add_argument("--limit", type=int, default=None, help="first N problems per benchmark")
    p.add_argument("--chunk", type=int, default=64, help="problems per generation chunk (the resume granularity)")
    p.add_argument("--workers", type=int, default=2, help="verifier processes")
    p.add_argument(
        "--timeout",
        type=float,
        default=5.0,
        help="CPU seconds per verification attempt, counted from when a verifier process begins it (at most 4x that "
        "in wall-clock time); an overrun is retried once before the status is 'timeout'",
    )
    p.add_argument("--per-benchmark", type=int, default=None, help="with --make-train-eval: problems per benchmark")
    return p


def _datasets(args) -> dict[str, list[dict]]:
    overrides = dict(x.split("=", 1) for x in args.data)
    dirs = args.data_dir or DEFAULT_DATA_DIRS
    out = {}
    for name in args.benchmarks:
        path = find_data(name, dirs, overrides)
        if path is None:
            print(
                f"[avspo-eval] {name}: no data file in {dirs} (prepare it: avspo-prepare-data prepare {name}); skipped"
            )
            continue
        out[name] = load_benchmark(name, path, args.template)
    if not out:
        raise SystemExit("no benchmark data found; see datasets/README.md")
    return out


def _generator(args, model: str):
    backend = args.backend
    if backend is None:
        import torch

        backend = "vllm" if torch.cuda.is_available() else "vllm-cpu"
    return VLLMGenerator(
        model,
        cpu=backend == "vllm-cpu",
        tensor_parallel=args.tp,
        data_parallel=args.dp,
        max_model_len=args.max_model_len,
        gpu_memory_utilization=args.gpu_memory_utilization,
        seed=args.seed,
        cpu_dtype=args.cpu_dtype,
    )


def main(argv: list[str] | None = None) -> int:
    startup_gc.pause()  # its imports (vLLM, torch, transformers) without the collector walking them
    try:
        return _main(build_parser().parse_args(argv))
    except (ValueError, FolderBusy) as e:  # another model's or writer's folder, a bad data row: one line
        print(f"avspo-eval: error: {e}", file=sys.stderr)
        return 2
    finally:
        startup_gc.resume()  # the generator resumes it once its engine is built; here whatever happened


def _main(args) -> int:
    if args.model:
        check_model(args.model, "--model")  # a wrong path is one line, not a transformers traceback
    if args.greedy:
        args.temperature, args.n = 0.0, 1
    data = _datasets(args)
    if args.make_train_eval:
        n = write_eval_mix(data, args.make_train_eval, args.per_benchmark)
        print(
            f"wrote {n} rows to {args.make_train_eval}: train with --eval.dataset {args.make_train_eval} "
            "--data.input_key prompt --data.label_key answer --data.apply_chat_template --eval.steps 50 "
            "--eval.temperature 0.1 --eval.n_samples_per_prompt 1"
        )
        return 0
    dec = Decoding(args.n, args.temperature, args.top_p, args.max_new_tokens, args.seed)
    ks = args.k or [k for k in (1, 2, 4, 8, 16, 32, 64, 128) if k <= args.n]
    common = dict(
        workers=args.workers,
        timeout_s=args.timeout,
        chunk=args.chunk,
        system_prompt=args.system_prompt,
        chat_template=not args.no_chat_template,
        ks=ks,
        limit=args.limit,
    )

    if args.run_dir:
        out = Path(args.output or os.path.join(args.run_dir, "eval"))
        lock_folder(str(out), "avspo-eval")  # one evaluation per folder: no problem recorded twice
        ckpts = find_checkpoints(args.run_dir)
        if not ckpts:
            raise SystemExit(f"no HF checkpoints under {args.run_dir} (train with --ckpt.save_hf)")
        rows = []
        for step, path in ckpts:
            label = "final" if step >= 10**9 else f"step {step}"
            step_dir = out / ("final" if step >= 10**9 else f"step_{step}")
            if (step_dir / "summary.json").exists() and (step_dir / "table.md").exists():
                res = json.loads((step_dir / "summary.json").read_text())["benchmarks"]
                if set(data) <= set(res):
                    print(f"[avspo-eval] {label}: done, skipped")
                    rows.append((step, res))
                    continue
            res = evaluate_model(
                _generator(args, path), data, dec, step_dir, label=label, identity=model_identity(path), **common
            )
            rows.append((step, res["benchmarks"]))
            print(res["table"])
            print(verification_line(res["verification"]))
        plot_steps(rows, out / "accuracy_vs_step.png")
        print(f"[avspo-eval] {len(rows)} checkpoints; plot: {out / 'accuracy_vs_step.png'}")
        return 0

    identity = None
    if args.oracle:
        gen, label = OracleGenerator(), "reference solutions"
    elif args.completions:
        gen, label = FileGenerator(args.completions), Path(args.completions).stem
    else:
        gen, label = _generator(args, args.model), Path(args.model.rstrip("/")).name
        identity = model_identity(args.model)
    default = label.replace(" ", "_")
    if identity and identity.startswith("blake2b:"):  # runs/a/final and runs/b/final: two folders
        default += "_" + identity.split(":")[1][:8]
    out = Path(args.output or os.path.join("eval_results", default))
    lock_folder(str(out), "avspo-eval")
    res = evaluate_model(gen, data, dec, out, label=label, identity=identity, **common)
    print(res["table"])
    print(verification_line(res["verification"]))
    print(f"[avspo-eval] results in {out}/ (records.jsonl per benchmark, summary.json, table.md)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
