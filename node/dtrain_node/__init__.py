"""Reference operator node: DeMo optimizer, compression, gossip sync and training."""

import logging as _logging

# torchao (pulled in by transformers and peft, unused here) warns at import that its compiled
# kernels do not match this torch; the node never calls them, so the line is only noise.
_logging.getLogger("torchao").setLevel(_logging.ERROR)
