"""Offline store: date-partitioned Parquet tiles and last values; point-in-time joins."""
