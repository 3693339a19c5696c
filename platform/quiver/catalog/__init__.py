"""The feature DSL, its loader and validator, and the Catalog IR they produce."""
