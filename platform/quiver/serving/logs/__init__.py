"""The serving log: what every prediction server served, written by the servers (`writer`), read by every job
that judges them (`read`), and kept tidy on the store root (`compact`, `accounts`). Serving owns it; monitoring,
the loop and the console only read it.

    writer.py      ServingLogger: buffered, off the request path, one file per flush and replica
    store_side.py  where a flush's rows go: the store, the spool, the quarantine, the accounts, the journal
    factory.py     `logger_for`: a project process's logger (store root, replica name, spool, journal)
    journal.py     rows given per process on local disk, so a killed process's losses are counted
    gauges.py      Prometheus gauges over the live loggers
    spool.py       the local spool for files an object store does not take yet
    tables.py      the log's schema (`log_schema`) and how logged rows become Arrow tables
    files.py       one file: its name, its bytes, the types the dataset keeps
    accounts.py    per replica and hour: rows written, quarantined, spooled, dropped
    read.py        every replica's rows of a window (`read_serving_logs`)
    compact.py     an hour of small files into one, atomically
"""

from quiver.serving.logs.factory import logger_for
from quiver.serving.logs.files import replica_name
from quiver.serving.logs.writer import (
    FEATURE_PREFIX,
    KEY_PREFIX,
    LOG_DIR,
    QUARANTINE_DIR,
    Batch,
    Record,
    RolloutTag,
    SchemaMismatch,
    ServingLogger,
    Spool,
    batches_to_table,
    feature_frame,
    log_schema,
    read_quarantine,
    read_serving_logs,
    records_to_table,
)

__all__ = ["FEATURE_PREFIX", "KEY_PREFIX", "LOG_DIR", "QUARANTINE_DIR", "Batch", "Record", "RolloutTag",
           "SchemaMismatch", "ServingLogger", "Spool", "batches_to_table", "feature_frame", "log_schema",
           "logger_for", "read_quarantine", "read_serving_logs", "records_to_table", "replica_name"]
