"""Generation: the continuous and static scheduler, the tiny decoder, ragged attention,
vLLM-compatible metrics."""
