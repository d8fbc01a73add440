"""``ray.tune.integration``: report callbacks for training libraries (``.xgboost``,
``.lightgbm``, ``.pytorch_lightning``), each needing its library."""
