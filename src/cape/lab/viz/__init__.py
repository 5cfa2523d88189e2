"""Plots of experiment results (PNG): curves over a swept variable, trade-offs, 2D maps.

matplotlib is optional (`pip install 'cape[plot]'`): importing `cape.lab.viz` never imports it; a
plot function raises ImportError when it is missing.
"""

from __future__ import annotations

from cape.lab.viz.maps import plot_maps
from cape.lab.viz.plots import plot_curves, plot_tradeoff

__all__ = ["plot_curves", "plot_tradeoff", "plot_maps"]
