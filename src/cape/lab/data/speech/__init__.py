"""cape/lab/data/speech."""
