"""``ray.tune.integration``: report callbacks for training libraries (``.xgboost``,
``.lightgbm``, ``.pytorch_lightning``, ``.keras``), each needing its library."""
