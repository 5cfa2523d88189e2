"""cape/lab."""
