"""`python -m gpulens.dashboards build`: same as `gpulens dashboards build`."""

import sys

from gpulens.dashboards.cli import main

sys.exit(main())
