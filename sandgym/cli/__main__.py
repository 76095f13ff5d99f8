"""`python -m sandgym.cli ...`: the `sandgym` command without the installed console script."""

import sys

from sandgym.cli.main import main

sys.exit(main())
