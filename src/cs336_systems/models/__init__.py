"""Model factories for the config's `own_model` key (docs/own-model.md)."""
