"""The streaming path: stream files → Flink SQL job → committed change files → online store.

    feeder.py   stream directory → the job's inbox: time-ordered batches, unparseable lines quarantined
    job.py      the Flink job (compile/flink.py's SQL): checkpointing, restore from the latest checkpoint
    loader.py   committed tile / last-value change files → the online store (vectorised, idempotent)
    status.py   counts (late, quarantined, loaded), freshness; status.json and Prometheus text
    runner.py   wires them together; `quiver stream` runs it in the streaming virtualenv

Only quiver's light core is imported here (no pyspark, duckdb, feast, torch, airflow); pyflink is imported
inside job.py's functions, so everything else also works in the main virtualenv.
"""
