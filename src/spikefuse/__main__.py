"""`python -m spikefuse ...`: the command line (what `torchrun -m spikefuse train ...` runs)."""
import sys

from spikefuse.cli import main

if __name__ == "__main__":
    sys.exit(main())
