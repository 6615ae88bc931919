"""The CPU backend's Ray worker hook (``avspo_openrlhf/cpu/worker.py``): each CUDA-call replacement of
``cuda_shims.py`` applied right after its module is first imported, and nothing imported before."""

import json
import subprocess
import sys
import textwrap

import pytest

from avspo_openrlhf.cpu.worker import after_import


def test_an_action_runs_once_after_the_modules_code_and_before_the_importer_gets_it(tmp_path, monkeypatch):
    (tmp_path / "watched_mod.py").write_text("VALUE = 1\ndef read():\n    return VALUE\n")
    (tmp_path / "importer_mod.py").write_text("from watched_mod import VALUE as SEEN\n")
    monkeypatch.syspath_prepend(str(tmp_path))
    calls = []

    def action(module):
        calls.append(module.VALUE)  # the module's own code has run
        module.VALUE = 2

    finders = list(sys.meta_path)
    after_import({"watched_mod": action})
    import importer_mod  # noqa: F401  (imports watched_mod)
    import watched_mod

    assert calls == [1] and importer_mod.SEEN == 2 and watched_mod.read() == 2
    assert type(watched_mod.__loader__).__name__ == "SourceFileLoader"  # the module keeps its own loader
    assert watched_mod.__spec__.loader is watched_mod.__loader__
    assert sys.meta_path == finders  # the finder leaves once every watched module was imported
    after_import({"watched_mod": action})  # one already imported: at once
    assert calls == [1, 2]
    for name in ("watched_mod", "importer_mod"):
        sys.modules.pop(name)


@pytest.mark.slow
def test_the_hook_imports_nothing_and_each_replacement_arrives_with_its_module():
    code = textwrap.dedent(
        """
        import json, sys
        from avspo_openrlhf.cpu.worker import install_cpu_worker
        install_cpu_worker()
        before = sorted(m for m in ("torch", "openrlhf", "deepspeed", "vllm") if m in sys.modules)
        import torch
        from openrlhf.utils.utils import convert_to_torch_dtype
        from openrlhf.utils.deepspeed import deepspeed as ds_mod
        from openrlhf.trainer.ppo_utils.replay_buffer import NaiveReplayBuffer
        print(json.dumps({
            "before": before,
            "current_device": torch.cuda.current_device(),
            "synchronize": torch.cuda.synchronize(),
            "fp32": str(convert_to_torch_dtype("fp32")),
            "bf16": str(convert_to_torch_dtype("bf16")),
            "mesh": ds_mod.init_device_mesh.__qualname__,
            "buffer": str(NaiveReplayBuffer(8).target_device),
        }))
        """
    )
    env = {"DS_ACCELERATOR": "cpu", "PATH": "/usr/bin:/bin"}
    r = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=300, env=env)
    assert r.returncode == 0, r.stderr[-3000:]
    seen = json.loads(r.stdout.strip().splitlines()[-1])
    assert seen == {
        "before": [],  # a queue or lock actor pays for none of them
        "current_device": "cpu",
        "synchronize": None,
        "fp32": "torch.float32",
        "bf16": "torch.bfloat16",
        "mesh": "_device_mesh.<locals>.init_device_mesh",
        "buffer": "cpu",
    }
