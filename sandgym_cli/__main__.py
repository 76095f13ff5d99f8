"""`python -m sandgym_cli ...`: the `sandgym` command without the installed console script."""

import sys

from sandgym_cli.main import main

sys.exit(main())
