"""Mutation check: plant each bug of parity/mutation/catalog.py and demand that the suite fails.

    python ci/mutation_check.py [--fast] [--mutant NAME] [--json PATH] [--all-cases] [--list]

Same as `python -m parity.cli mutants`; see parity/mutants.py.
"""
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from parity.mutants import main  # noqa: E402

if __name__ == "__main__":
    sys.exit(main())
