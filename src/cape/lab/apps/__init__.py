"""cape/lab/apps."""
