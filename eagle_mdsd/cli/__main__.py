"""`python -m eagle_mdsd.cli`, as the `eagle-mdsd` command."""

import sys

from . import main

sys.exit(main())
