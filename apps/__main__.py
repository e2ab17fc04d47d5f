"""`python -m rlslice.apps` is the `rlslice` command."""

import sys

from rlslice.apps.cli import main

sys.exit(main())
