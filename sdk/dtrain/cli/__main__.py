"""`python -m dtrain.cli`."""

import sys

from . import main

sys.exit(main())
