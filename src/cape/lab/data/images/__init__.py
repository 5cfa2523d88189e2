"""cape/lab/data/images."""
