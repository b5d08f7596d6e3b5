"""Regenerate the acceptance study: `python evaluation/acceptance_study.py all` (= `eagle-mdsd study all`)."""

import sys

from eagle_mdsd.cli import main

if __name__ == "__main__":
    sys.exit(main(["study", *(sys.argv[1:] or ["all"])]))
