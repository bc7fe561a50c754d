"""Embeddings: the dynamic batcher (fixed and adaptive policies) in front of a small
random-weight encoder."""
