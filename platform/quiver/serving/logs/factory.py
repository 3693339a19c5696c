"""A project's serving logger, as its server processes build it: on the store root, named for the replica,
with a spool on an object store and a journal on local disk."""

from __future__ import annotations

from typing import Any

import pyarrow as pa

from quiver.serving.logs.files import replica_name
from quiver.serving.logs.spool import Spool
from quiver.serving.logs.writer import ServingLogger


def logger_for(config: Any, schema: pa.Schema | None = None, *, replica: str | None = None,
               **options: Any) -> ServingLogger:
    """The serving logger of a process of `config`'s project (servers and the demo build theirs here): files
    under the store root (`offline_root`: a folder or an object store), named for this replica (`replica`,
    else `replica_id`, $QUIVER_REPLICA_ID or the host), and, on an object store, a spool in the local
    `spool_dir/<replica>` for what the store cannot take while it is down, and a journal beside it
    (`<replica>/_journal`) of the rows given, so a killed process's losses are counted."""
    from quiver.offline.store import store_for

    store = store_for(config)
    name = replica_name(replica or config.replica_id or None)
    local = config.root / config.spool_dir / name
    spool = None if store.is_local else Spool(local, max_bytes=int(config.spool_max_mb * (1 << 20)))
    return ServingLogger(store, schema=schema, replica=name, spool=spool, journal=local / "_journal", **options)
