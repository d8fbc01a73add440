"""An experiment's contents: its trials, their logs, its commits read and written, its results."""
