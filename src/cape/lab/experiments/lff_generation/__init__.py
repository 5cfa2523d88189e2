"""cape/lab/experiments/lff_generation."""
