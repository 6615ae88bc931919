"""``avspo-prepare-model smollm2|tiny``: the CPU pipeline's offline models as HF folders
(SmolLM2-135M-Instruct from the PyPI-packaged GGUF, or the random test model); see cpu/models.py."""

from __future__ import annotations

import argparse
import sys

from avspo_openrlhf.cpu.models import DEFAULT_CACHE, prepare


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(allow_abbrev=False, prog="avspo-prepare-model", description=__doc__.split("\n\n")[0])
    p.add_argument(
        "name", choices=["smollm2", "tiny"], help="smollm2: SmolLM2-135M-Instruct from PyPI; tiny: random test model"
    )
    p.add_argument("--output", default=None, help=f"folder (default: {DEFAULT_CACHE}/<name>)")
    args = p.parse_args(argv)
    print(prepare(args.name, args.output))
    return 0


if __name__ == "__main__":
    sys.exit(main())
