"""Errors that point at the user's definition: kind, name, file and line."""

from __future__ import annotations

import difflib
from collections.abc import Iterable
from dataclasses import dataclass

from quiver.catalog.definitions import Location


class QuiverError(Exception):
    """Base class for errors caused by user input (the CLI prints them as one line, exit code 2)."""


class RequestFieldError(QuiverError):
    """A request's `fields` do not match the request sources the features read: a field is missing,
    unknown, of the wrong type, or refused by its source's contract (the servers answer 400, naming it)."""


class NoRowsError(QuiverError):
    """A check found no rows to judge. An empty read is never a pass: the message says what was looked for,
    where, and what is there instead (the CLI exits 2; nothing is recorded)."""


def did_you_mean(name: str, candidates: Iterable[str]) -> str:
    """' (did you mean 'x'?)' for the closest candidate, or '' when nothing is close: the one hint every
    "unknown name" error gives (definitions, columns, models, versions, aliases)."""
    match = difflib.get_close_matches(name, list(candidates), n=1, cutoff=0.6)
    return f" (did you mean {match[0]!r}?)" if match else ""


@dataclass(frozen=True)
class DefinitionProblem:
    """One thing wrong with one definition."""

    kind: str
    name: str
    location: Location
    message: str

    def __str__(self) -> str:
        # One problem, one line: reports list problems line by line (library messages may span several).
        message = " ".join(self.message.splitlines())
        return f"{self.location}: {self.kind.replace('_', ' ')} {self.name!r}: {message}"


class CatalogError(QuiverError):
    """The catalog is invalid; `problems` lists every problem found, each naming its definition and file."""

    def __init__(self, problems: list[DefinitionProblem]):
        self.problems = problems
        count = f"{len(problems)} problem{'s' if len(problems) != 1 else ''}"
        super().__init__(f"invalid catalog ({count}):\n" + "\n".join(f"  {p}" for p in problems))
