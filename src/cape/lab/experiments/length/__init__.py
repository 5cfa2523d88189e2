"""The length experiment: trained on short sequences, tested on 2x-8x longer ones."""
