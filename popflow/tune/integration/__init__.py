"""``ray.tune.integration``: report callbacks for training libraries (``.xgboost``,
``.lightgbm``), each needing its library."""
