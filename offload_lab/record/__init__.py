"""Recorded data: the Run and its frames, the offload runtime, the observer, and trace import."""
