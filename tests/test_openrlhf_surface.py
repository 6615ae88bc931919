"""Every private OpenRLHF name the project touches, and every OpenRLHF module global it replaces:
an OpenRLHF upgrade that renames or removes one fails here, naming what to re-check."""

import inspect
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
    "_process_response_into_experience": (
        "trainer/ppo_utils/samples_generator.py",
        "overridden: policy_version, datasource tags",
    ),
    "_compute_rollout_stats": ("trainer/ppo_trainer.py", "overridden: adds the experience maker's ACR metrics"),
    "_load_agent_executor": (
        "trainer/ray/vllm_engine.py",
        "CPUEngine loads the reward/agent file like RolloutRayActor",
    ),
    "_mm_pad_token_ids": ("trainer/ray/vllm_engine.py", "CPUEngine sets it: RolloutRayActor's generate path reads it"),
    "_partial_rollout": ("trainer/ppo_trainer_async.py", "our TrainingActor.broadcast_to_vllm reads it"),
    "_dispatch_forward": (
        "trainer/ppo_utils/experience_maker.py",
        "overridden (trainer/token_level.py): the policy's forward also returns a token-level remedy's entropies",
    ),
    "_flatten_results": (
        "trainer/ppo_utils/experience_maker.py",
        "overridden (trainer/token_level.py): splits the policy's log-probs from those entropies",
    ),
    "_read_ckpt_metric": ("utils/deepspeed/deepspeed.py", "CrashSafeStrategy evicts in OpenRLHF's order (metric)"),
    "_master_port": (
        "trainer/ray/launcher.py",
        "CPU actors serve the rendezvous store on loopback and set the port it reads",
    ),
}

# attributes of PPOTrainerAsync that OpenRLHF's fit()/get_max_steps() read and our own __init__ sets
ASYNC_TRAINER_ATTRS = ("generator_actor", "trainer_actor")


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


def test_replaced_attributes_exist_and_are_restored():
    """Every replacement avspo_openrlhf/install.py makes targets an attribute OpenRLHF (or torch)
    still has, and leaving ``installed()`` puts the original back."""
    from avspo_openrlhf.install import _replacements, installed

    patches = _replacements(trainers=True, cpu=True)
    assert len(patches) == 10
    before = [getattr(p.target, p.attribute) for p in patches]
    with installed(trainers=True, cpu=True):
        inside = [getattr(p.target, p.attribute) for p in patches]
    assert all(now is not orig and type(now) is type(p.new) for now, orig, p in zip(inside, before, patches))
    assert [getattr(p.target, p.attribute) for p in patches] == before


def test_swap_restores_own_and_inherited_attributes_and_refuses_missing_ones():
    import types

    from avspo_openrlhf.swap import Swap

    class Base:
        def f(self):
            return "base"

    class Child(Base):
        def g(self):
            return "child"

    with Swap(Child, "f", lambda self: "new"):  # inherited: shadowed inside, gone again after
        assert Child().f() == "new"
    assert "f" not in vars(Child) and Child().f() == "base"
    s = Swap(Child, "g", lambda self: "new")
    s.start()
    assert Child().g() == "new" and s.original()(Child()) == "child"
    s.stop()
    assert Child().g() == "child"
    mod = types.ModuleType("m")
    mod.x = 1
    with Swap(mod, "x", 2):
        assert mod.x == 2
    assert mod.x == 1
    with pytest.raises(AttributeError, match="no attribute 'y'"):
        Swap(mod, "y", 3)


def test_install_lists_the_nested_replacement_and_the_stand_in_modules():
    from avspo_openrlhf.cpu import compat, cuda_shims
    from avspo_openrlhf.install import STAND_IN_MODULES

    built = {**compat._flash_attn_modules(), **compat._vllm_modules()}
    assert set(STAND_IN_MODULES) == set(built)
    src = inspect.getsource(cuda_shims)
    nested = re.findall(r"with Swap\((\w+(?:\.\w+)*), \"(\w+)\"", src)
    assert [f"{obj}.{name}" for obj, name in nested] == [n for n, _ in cuda_shims.NESTED_REPLACEMENTS]


def test_async_trainer_sets_what_openrlhf_fit_reads():
    import inspect

    from openrlhf.trainer.ppo_trainer_async import PPOTrainerAsync

    from avspo_openrlhf.trainer import trainers

    fit = inspect.getsource(PPOTrainerAsync.__ray_actor_class__.fit)
    fit += inspect.getsource(PPOTrainerAsync.__ray_actor_class__.get_max_steps)
    read = set(re.findall(r"self\.([a-z_]+)", fit))
    assert read == set(ASYNC_TRAINER_ATTRS), (
        f"OpenRLHF's async fit() now reads {sorted(read)}: re-check _PPOTrainerAsync"
    )
    ours = inspect.getsource(trainers._PPOTrainerAsync.__init__)
    assert all(f"self.{a} =" in ours for a in ASYNC_TRAINER_ATTRS)


def test_no_patching_outside_install_module():
    """Outside install.py (and the CPU worker hook, cpu/worker.py) nothing of the package assigns
    attributes of another module or class (setattr on a module, mock.patch, ``module.attr = ...``,
    a ``Swap``); the scan would catch the old runpy/parse_args/ray.is_initialized patches and the
    async trainer's module-global swap."""
    pattern = re.compile(
        r"unittest|mock\.patch|\bSwap\(|setattr\((_?async|ray|argparse|orl_\w+|ppo_\w+|torch)\b|"
        r"^\s*(ray|argparse|torch|_async|ppo_trainer\w*|orl_\w+)\.[\w.]+\s*=[^=]",
        re.M,
    )
    allowed = {"install.py", "swap.py", "cpu/worker.py", "cpu/cuda_shims.py"}
    offenders = []
    for f in OURS.rglob("*.py"):
        if str(f.relative_to(OURS)) in allowed:
            continue  # cuda_shims defines the CPU replacements; install.py and the CPU worker hook apply them
        offenders += [f"{f.relative_to(OURS)}: {m.group(0)}" for m in pattern.finditer(f.read_text(encoding="utf-8"))]
    assert not offenders, offenders


# Upstream method bodies we mirror in our own code (copied and changed, not called): the AST hash of
# each in OpenRLHF 0.11.2. When OpenRLHF changes one, this names it and the copy to re-check.
MIRRORED = [
    *(
        ("trainer/ppo_trainer_async.py", "VLLMLock", fn, digest, "avspo_openrlhf/trainer/async_actors.py: VLLMLock")
        for fn, digest in (
            ("__init__", "5aa8db9a269b148d"),
            ("acquire", "e3087dd8ee271119"),
            ("release", "b6dc1f7579358afe"),
        )
    ),
    (
        "trainer/ppo_trainer_async.py",
        "PPOTrainerAsync",
        "__init__",
        "b7b0f8597d44dcaf",
        "avspo_openrlhf/trainer/trainers.py: _PPOTrainerAsync.__init__ (queue, slots, vLLM lock, actors)",
    ),
    (
        "trainer/ppo_trainer_async.py",
        "TrainingActor",
        "broadcast_to_vllm",
        "8a19a788a2547104",
        "avspo_openrlhf/trainer/trainers.py: _TrainingActor.broadcast_to_vllm (lock, pause, version)",
    ),
    (
        "trainer/ppo_utils/samples_generator.py",
        "SamplesGenerator",
        "_generate_vllm",
        "6dacc17794e952d0",
        "avspo_openrlhf/trainer/samples.py: RemedySamplesGenerator._generate_std_filtered (dispatch, wait, refill)",
    ),
]


def _method_hash(path: str, cls: str, fn: str) -> str | None:
    import ast
    import hashlib

    tree = ast.parse((ORL / path).read_text(encoding="utf-8"))
    for c in ast.walk(tree):
        if isinstance(c, ast.ClassDef) and c.name == cls:
            for f in c.body:
                if isinstance(f, (ast.FunctionDef, ast.AsyncFunctionDef)) and f.name == fn:
                    return hashlib.sha256(ast.dump(f).encode()).hexdigest()[:16]
    return None


@pytest.mark.parametrize("path, cls, fn, digest, ours", MIRRORED, ids=[f"{c}.{f}" for _, c, f, _, _ in MIRRORED])
def test_mirrored_upstream_bodies_are_unchanged(path, cls, fn, digest, ours):
    got = _method_hash(path, cls, fn)
    assert got is not None, f"openrlhf/{path}: {cls}.{fn} no longer exists; re-check {ours}"
    assert got == digest, f"openrlhf/{path}: {cls}.{fn} changed (AST hash {got}, mirrored {digest}); re-check {ours}"
