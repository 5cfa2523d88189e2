"""cape/lab/experiments/asr."""
