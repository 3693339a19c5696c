"""Builders for catalog tests: real Parquet sources and catalog directories written into tmp_path."""
