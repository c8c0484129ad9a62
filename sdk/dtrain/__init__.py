"""Python SDK for the DistributedTrainingBSM contract."""

__version__ = "0.1.0"
