"""cape/lab/data/text."""
