"""`python -m cyserve module:app [options]`: the same as the `cyserve` command."""

import sys

from .cli import main

if __name__ == "__main__":
    sys.exit(main())
