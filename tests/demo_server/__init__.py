"""The demo server: generation, the embedding batcher, its HTTP edge and the load generator."""
