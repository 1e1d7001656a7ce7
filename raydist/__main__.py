"""``python -m raydist``: the same command line as the ``raydist`` script."""

import sys

from raydist.cli import main

if __name__ == "__main__":
    sys.exit(main())
