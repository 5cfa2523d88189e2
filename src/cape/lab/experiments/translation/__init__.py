"""cape/lab/experiments/translation."""
