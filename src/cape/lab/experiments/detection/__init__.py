"""The detection experiment (LFF paper sec. 4.2): a small DETR at image sizes never seen in
training."""
