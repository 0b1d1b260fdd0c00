"""Pure transforms of Run frames: metrics, bounds and comparisons."""
