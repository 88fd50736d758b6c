"""`python -m schedspec`: the command line (cli/main.py)."""

import sys

from schedspec.cli.main import main

sys.exit(main())
