"""Every private OpenRLHF name the project touches, and every OpenRLHF module global it replaces:
an OpenRLHF upgrade that renames or removes one fails here, naming what to re-check."""

import re
from pathlib import Path

import pytest

pytest.importorskip("openrlhf")
import openrlhf  # noqa: E402

OURS = Path(__file__).resolve().parents[1] / "avspo_openrlhf"
ORL = Path(openrlhf.__file__).resolve().parent

# name -> (OpenRLHF module that defines it, what we do with it)
PRIVATE = {
    "_collect_prompt_batch": ("trainer/ppo_utils/samples_generator.py", "std dynamic filter pulls replacement prompts"),
    "_dispatch_prompts_to_vllm": ("trainer/ppo_utils/samples_generator.py", "std dynamic filter dispatches groups"),
    "_generate_vllm": ("trainer/ppo_utils/samples_generator.py", "overridden: version tags, requeued prompts, filter"),
    "_process_response_into_experience": ("trainer/ppo_utils/samples_generator.py", "overridden: policy_version, datasource tags"),
    "_compute_rollout_stats": ("trainer/ppo_trainer.py", "overridden: adds the experience maker's ACR metrics"),
    "_load_agent_executor": ("trainer/ray/vllm_engine.py", "CPUEngine loads the reward/agent file like RolloutRayActor"),
    "_mm_pad_token_ids": ("trainer/ray/vllm_engine.py", "CPUEngine sets it: RolloutRayActor's generate path reads it"),
    "_partial_rollout": ("trainer/ppo_trainer_async.py", "our TrainingActor.broadcast_to_vllm reads it"),
}  # fmt: skip

# module globals we replace (trainers.install / _PPOTrainerAsync), and the attribute they must keep
REPLACED = {
    "openrlhf.trainer.ppo_trainer": ["PPOTrainer"],
    "openrlhf.trainer.ppo_trainer_async": ["PPOTrainerAsync", "VLLMLock", "GenerateSamplesActor", "TrainingActor"],
}


def _private_defs(text: str) -> set[str]:
    return {m.group(2) for m in re.finditer(r"(def |self\.|^|\n)(_[a-z][a-z0-9_]*)", text)}


def test_every_private_openrlhf_name_we_use_is_listed_and_still_exists():
    ours = set()
    for f in OURS.rglob("*.py"):
        ours |= set(re.findall(r"\b_[a-z][a-z0-9_]*\b", f.read_text(encoding="utf-8")))
    theirs = set()
    for f in ORL.rglob("*.py"):
        theirs |= _private_defs(f.read_text(encoding="utf-8"))
    used = ours & theirs
    assert used == set(PRIVATE), (
        f"private OpenRLHF names used but not listed here: {sorted(used - set(PRIVATE))}; "
        f"listed but no longer defined by OpenRLHF (or no longer used): {sorted(set(PRIVATE) - used)}"
    )
    for name, (module, _why) in PRIVATE.items():
        assert name in (ORL / module).read_text(encoding="utf-8"), f"{name} moved out of openrlhf/{module}"


def test_replaced_module_globals_exist():
    import importlib

    for module, names in REPLACED.items():
        mod = importlib.import_module(module)
        for n in names:
            assert hasattr(mod, n), f"{module}.{n} is gone: re-check avspo_openrlhf/trainer/trainers.py"
