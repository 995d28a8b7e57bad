"""Config: the model (pure) and its loader."""
