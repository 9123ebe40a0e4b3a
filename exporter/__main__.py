"""`python -m gpulens.exporter` runs the node exporter daemon."""

import sys

from gpulens.exporter.cli import main

sys.exit(main())
