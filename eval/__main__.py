import sys

from avspo_openrlhf.evaluation.cli import main

sys.exit(main())
