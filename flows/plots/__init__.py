"""Plots of an experiment in storage."""
