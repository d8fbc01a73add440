"""The experiment folder: its layout (every path in it, named by ``layout``) and its atomic
commits: commit log, lease, checkpoints."""
