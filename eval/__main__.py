import sys

from avspo_openrlhf.cli.evaluate import main

sys.exit(main())
