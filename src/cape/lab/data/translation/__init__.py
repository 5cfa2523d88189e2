"""cape/lab/data/translation."""
