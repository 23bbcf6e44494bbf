"""`python -m cli ...` runs the `ssd` command (the same as `.venv/bin/ssd`), e.g. from a checkout on PYTHONPATH."""

import sys

from cli.main import main

sys.exit(main())
