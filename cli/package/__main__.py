import sys

from schedspec.cli.main import main

sys.exit(main())
