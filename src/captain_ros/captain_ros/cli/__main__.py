"""`python -m captain_ros.cli`: the `captain-ros` tool without installing its console script."""

import sys

from captain_ros.cli import main

if __name__ == "__main__":
    sys.exit(main())
