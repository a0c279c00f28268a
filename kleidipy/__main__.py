"""``python -m kleidipy``: the ``kleidipy`` command."""

import sys

from kleidipy.cli import main

sys.exit(main())
