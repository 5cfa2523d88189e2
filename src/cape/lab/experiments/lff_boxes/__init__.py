"""cape/lab/experiments/lff_boxes."""
