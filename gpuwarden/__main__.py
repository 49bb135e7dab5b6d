"""`python -m gpuwarden` is the same as the `gpuwarden` console script."""

import sys

from gpuwarden.cli import main

sys.exit(main())
