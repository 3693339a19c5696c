"""Registry database errors as one line a person can act on (the CLI shows these instead of a traceback)."""

from __future__ import annotations

from typing import Any

# (text in the driver's message, what to tell the user); first match wins.
_KNOWN = (
    ("readonly database", "the registry database is read-only: this command writes to it; give write access "
                          "to the file and its folder (SQLite writes a journal beside it), or point "
                          "registry_url at a writable copy"),
    ("read-only", "the registry database is read-only: this command writes to it"),
    ("database is locked", "the registry is locked by another writer and stayed locked past the timeout; "
                           "retry when that command has finished"),
    ("unable to open database", "cannot open the registry database: check registry_url and that its folder "
                                "exists and is readable"),
    ("disk is full", "the registry database cannot grow: the disk is full"),
    ("database or disk is full", "the registry database cannot grow: the disk is full"),
    ("disk i/o error", "the registry database hit a disk I/O error"),
    ("file is not a database", "registry_url points at a file that is not an SQLite database"),
    ("connection refused", "the registry database refused the connection: is the server running?"),
    ("could not translate host name", "the registry database host name does not resolve"),
    ("password authentication failed", "the registry database refused the credentials"),
)


def describe_database_error(exc: BaseException) -> str | None:
    """One line for a SQLAlchemy error (None when `exc` is not one): the known cases in plain words, else the
    driver's first line, never the SQL statement or a traceback."""
    try:
        from sqlalchemy.exc import SQLAlchemyError
    except ImportError:  # pragma: no cover - the registry needs sqlalchemy anyway
        return None
    if not isinstance(exc, SQLAlchemyError):
        return None
    original: Any = getattr(exc, "orig", None)
    text = str(original if original is not None else exc).strip().splitlines()[0] if str(exc).strip() else ""
    lowered = text.lower()
    for needle, message in _KNOWN:
        if needle in lowered:
            return f"registry: {message} ({text[:200]})"
    return f"registry error ({type(original or exc).__name__}): {text[:300]}"
