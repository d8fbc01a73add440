"""The experiment folder's layout and its atomic commits: commit log, lease, checkpoints."""
