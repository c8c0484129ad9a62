"""`python -m dtrain_node.devnet`: the whole story on one machine (`make demo`)."""

import sys

from . import main

sys.exit(main())
