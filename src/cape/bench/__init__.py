"""Benchmarks of the cost of positional encodings (`cape bench ...`)."""
