"""Data pipelines: demo data generation and batch/stream jobs."""
