"""`python -m paralab.plan`: the layout planner of `paralab.scale.plan`, under a short name."""

import sys

from paralab.scale.plan import main

if __name__ == "__main__":
    sys.exit(main())
