"""Reference operator node: DeMo optimizer, compression, gossip sync and training."""
