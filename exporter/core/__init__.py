"""The batching math: pure functions over plain data, no I/O and no clock."""
