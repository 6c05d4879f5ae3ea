"""`python -m exactly_cli`: the same command line as the `exactly` script."""

import sys

from exactly_cli import main

sys.exit(main())
