"""Ray's callbacks and logger integrations (TensorBoard, MLflow)."""
