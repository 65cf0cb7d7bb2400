"""`python -m conformance.cli`: the remat-conformance command."""
import sys

from conformance.cli.main import main

sys.exit(main())
