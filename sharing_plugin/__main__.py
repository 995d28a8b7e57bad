"""`python -m sharing_plugin` runs the command line."""

import sys

from sharing_plugin.cli import main

sys.exit(main())
