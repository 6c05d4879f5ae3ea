import sys

from exactly_cli import main

sys.exit(main())
