"""Catalog IR → engines: one table of aggregation fns, one thin module per target."""
