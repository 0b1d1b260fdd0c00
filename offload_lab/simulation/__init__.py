"""Predicting a plan's timeline without a GPU: device profiles, the event engine, calibration."""
