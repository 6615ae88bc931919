"""What a study run's numbers depend on besides its arm, seed and settings, each part a short hash or a
value: runs pair (``store.check_pairable``) only when :func:`settings_hash` of their records is
equal, so a record must name what changes results and nothing else. A study spans several GPU sessions
from one frozen commit: a config re-saved by another transformers, a docstring or a refactor must not
unpair its runs; another chat template, torch or GPU must.

So the model is hashed by its weight tensors and its semantic config keys (not its file bytes), the
tokenizer by its vocabulary, special tokens and chat template, the prompts as rendered and tokenized,
and the code not at all: ``spec.LOOP_SEMANTICS`` is bumped by hand when what a run computes changes.
:func:`code_fingerprint` is still recorded beside the record, as information."""

from __future__ import annotations

import contextlib
import functools
import hashlib
import json
import re
from pathlib import Path

from avspo_openrlhf.data.tasks import make_prompt

# config.json keys that do not change what is computed: provenance, and the stored dtype (the loop loads
# fp32 whatever it says; the weights' own dtype is in the tensor hash)
CONFIG_NOT_SEMANTIC = frozenset({"transformers_version", "_name_or_path", "torch_dtype", "dtype", "use_cache"})
# generation_config.json: every other key stays (a repetition_penalty changes the process engine's sampling)
GENERATION_NOT_SEMANTIC = frozenset(
    {"transformers_version", "_from_model_config", "use_cache", "output_attentions", "output_hidden_states"}
)


def settings_hash(record: dict) -> str:
    """A short hash of ``RunSpec.settings_record`` (and of the run's compute precision, which the
    study adds): runs pair only when it is equal."""
    return hashlib.sha256(json.dumps(record, sort_keys=True).encode()).hexdigest()[:16]


def settings_difference(a: dict, b: dict, prefix: str = "") -> list[str]:
    """The fields where two settings records differ, ``name: a vs b`` (nested fields dotted)."""
    out = []
    for k in sorted(set(a) | set(b)):
        x, y = a.get(k), b.get(k)
        if isinstance(x, dict) and isinstance(y, dict):
            out += settings_difference(x, y, f"{prefix}{k}.")
        elif x != y:
            out.append(f"{prefix}{k}: {x!r} vs {y!r}")
    return out


def file_sha256(path: str | Path) -> str:
    h = hashlib.sha256()
    with open(path, "rb") as f:
        for chunk in iter(lambda: f.read(1 << 20), b""):
            h.update(chunk)
    return h.hexdigest()[:16]


def _stamp(path: str | Path) -> tuple:
    """A cache key that changes when a file, or any file of a folder, is rewritten: (name, size, mtime)."""
    p = Path(path)
    files = sorted(f for f in p.iterdir() if f.is_file()) if p.is_dir() else [p] if p.is_file() else []
    return (str(p.resolve()), *((f.name, f.stat().st_size, f.stat().st_mtime_ns) for f in files))


def _semantic_json(path: Path, drop: frozenset[str]) -> dict | None:
    if not path.is_file():
        return None
    return {k: v for k, v in json.loads(path.read_text(encoding="utf-8")).items() if k not in drop}


def model_fingerprint(model: str) -> str:
    """A hash of a model folder's weight tensors (names, dtypes, shapes, bytes, whatever the files'
    sharding), its config.json and generation_config.json without their non-semantic keys. The path is
    not part of it, so the same model on two machines pairs."""
    if not Path(model).is_dir():
        return f"name:{model}"
    return _model_hash(_stamp(model))


@functools.lru_cache(maxsize=8)
def _model_hash(stamp: tuple) -> str:
    import torch

    folder = Path(stamp[0])
    h = hashlib.sha256()
    configs = {
        "config": _semantic_json(folder / "config.json", CONFIG_NOT_SEMANTIC),
        "generation": _semantic_json(folder / "generation_config.json", GENERATION_NOT_SEMANTIC),
    }
    h.update(json.dumps(configs, sort_keys=True).encode())
    with contextlib.ExitStack() as stack:
        tensors = _weights(folder, stack)
        for name in sorted(tensors):
            t = tensors[name]()
            h.update(json.dumps([name, str(t.dtype), list(t.shape)]).encode())
            h.update(t.detach().contiguous().reshape(-1).view(torch.uint8).numpy())  # its buffer, not a copy
    return h.hexdigest()[:16]


def _weights(folder: Path, stack: contextlib.ExitStack) -> dict:
    """name -> a loader of that tensor, from the folder's safetensors (what transformers loads first),
    else its pytorch_model*.bin; loaded one at a time, so a large model is not held whole in memory."""
    files = sorted(folder.glob("*.safetensors"))
    if files:
        from safetensors import safe_open

        out = {}
        for f in files:
            handle = stack.enter_context(safe_open(str(f), framework="pt"))
            out.update({k: functools.partial(handle.get_tensor, k) for k in handle.keys()})
        return out
    import torch

    out = {}
    for f in sorted(folder.glob("pytorch_model*.bin")):
        state = torch.load(f, map_location="cpu", weights_only=True, mmap=True)
        out.update({k: functools.partial(state.__getitem__, k) for k in state})
    return out


@functools.lru_cache(maxsize=8)
def _tokenizer(model: str, stamp: tuple):
    from transformers import AutoTokenizer

    return AutoTokenizer.from_pretrained(model, padding_side="left")


def load_tokenizer(model: str):
    """The model's tokenizer, loaded once per process while its files are unchanged."""
    return _tokenizer(model, _stamp(model) if Path(model).is_dir() else ())


def tokenizer_fingerprint(model: str) -> str:
    """A hash of the tokenizer's vocabulary, its added and special tokens (the pad the loop uses: pad,
    else eos) and its chat template."""
    tok = load_tokenizer(model)
    added = [
        [i, t.content, t.special, t.lstrip, t.rstrip, t.single_word, t.normalized]
        for i, t in sorted(tok.added_tokens_decoder.items())
    ]
    return settings_hash(
        {
            "vocab": sorted(tok.get_vocab().items()),
            "added": added,
            "special": tok.special_tokens_map,
            "pad": tok.pad_token or tok.eos_token,
            "chat_template": tok.chat_template,
        }
    )


def chat_prompts(tok, problems: list[str], template: str) -> list[str]:
    """What the model is fed for each problem: ``make_prompt``'s text, or its messages through the
    tokenizer's chat template (``hf_engine.Policy.chats``, and what the prompts' hash reads)."""
    return [
        p if isinstance(p, str) else tok.apply_chat_template(p, tokenize=False, add_generation_prompt=True)
        for p in (make_prompt(q, template) for q in problems)
    ]


def prompts_fingerprint(model: str, template: str, *paths: str) -> str:
    """A hash of every row's prompt in the data files, rendered (:func:`chat_prompts`) and tokenized:
    another system prompt, prompt template or tokenization changes it."""
    stamp = _stamp(model) if Path(model).is_dir() else ()
    return _prompts_hash(model, stamp, template, tuple((p, _stamp(p)) for p in paths))


@functools.lru_cache(maxsize=8)
def _prompts_hash(model: str, stamp: tuple, template: str, files: tuple) -> str:
    from avspo_openrlhf.study.task import read_rows

    tok = load_tokenizer(model)
    texts = chat_prompts(tok, [r["problem"] for path, _ in files for r in read_rows(path)], template)
    return settings_hash({"texts": texts, "ids": tok(texts)["input_ids"]})


@functools.lru_cache(maxsize=1)
def versions() -> dict:
    """The libraries whose kernels and sampling compute a run: another version may change its numbers."""
    import torch
    import transformers

    return {"torch": torch.__version__, "transformers": transformers.__version__, "cuda": torch.version.cuda}


def device_kind(name: str) -> str:
    """The kind of device a run computes on, from its name (``spec.device_name``): a CPU's core count
    changes the speed, not the numbers, so it is dropped."""
    return re.sub(r", \d+ cores?\b", "", name)


# the code a run's numbers depend on: the loop, the algorithm, the rewards (not the docs, not the report)
_CODE = (
    "study/spec.py",
    "study/protocol.py",
    "study/objective.py",
    "study/hf_engine.py",
    "study/loop.py",
    "study/task.py",
    "study/controls.py",
    "study/engine.py",
    "study/stacked.py",
    "algo",
    "rewards",
)


@functools.lru_cache(maxsize=1)
def code_fingerprint() -> str:
    """A hash of the source a run's numbers depend on (:data:`_CODE`), recorded beside a run's settings
    as information, not paired on: a docstring edit changes it, not what the run computes."""
    root = Path(__file__).resolve().parents[1]
    h = hashlib.sha256()
    for part in _CODE:
        for f in sorted((root / part).rglob("*.py")) if (root / part).is_dir() else [root / part]:
            h.update(str(f.relative_to(root)).encode())
            h.update(f.read_bytes())
    return h.hexdigest()[:16]
