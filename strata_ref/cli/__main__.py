"""`python -m strata_ref.cli`: the `strata-ref` command."""
import sys

from . import main

sys.exit(main())
