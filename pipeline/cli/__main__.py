"""``python -m pipeline.cli``: the ``skewer`` command, as the orchestrator starts each stage."""

import sys

from pipeline.cli.app import main

sys.exit(main())
