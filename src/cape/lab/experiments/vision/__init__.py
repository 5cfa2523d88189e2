"""cape/lab/experiments/vision."""
