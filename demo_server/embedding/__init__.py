"""Embeddings: the dynamic batcher (fixed and adaptive policies) in front of the seeded encoder."""
