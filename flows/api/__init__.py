"""Front doors: `popflow.run`, Ray's `Tuner` and `tune.run`, the command line."""
