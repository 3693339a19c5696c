"""What every command module shares: the consoles, the common options, the user-error wrapper (one red line,
exit code 2, never a traceback) and how a command opens its project. Imports nothing else of `quiver.cli`."""

from __future__ import annotations

import functools
import os
import sys
from collections.abc import Callable
from datetime import UTC, datetime
from pathlib import Path
from typing import Annotated, Any, ClassVar, TypeVar

import typer
from rich.console import Console
from rich.markup import escape
from typer.core import TyperGroup

from quiver.catalog.errors import CatalogError, QuiverError
from quiver.catalog.ir import Catalog
from quiver.catalog.loader import load_catalog
from quiver.config import Config, load_config, project_required

# Piped output (scripts, CI logs) gets Rich's 80 columns, which truncates names in tables: use a wide line
# there unless COLUMNS says otherwise.
_WIDTH = None if sys.stdout.isatty() or "COLUMNS" in os.environ else 200


console = Console(width=_WIDTH)


err_console = Console(stderr=True, width=_WIDTH)


ConfigOption = Annotated[Path | None, typer.Option("--config", help="quiver.yaml (default: $QUIVER_CONFIG, else the "
                                                                   "first in this folder or one above it)")]


CatalogOption = Annotated[Path | None, typer.Option("--catalog", help="catalog directory (default: from config)")]


# One way to pick views in every command that takes them: --view NAME, repeated or comma-separated.
ViewsOption = Annotated[list[str] | None, typer.Option("--view", "--views", help="only this view: repeat or "
                                                                                 "comma-separate (default: all)")]


F = TypeVar("F", bound=Callable[..., Any])


def user_errors(func: F) -> F:
    """Turn QuiverError (and registry database errors) into red lines on stderr and exit code 2.

    Every command wears it, so it also holds the rule that a command works on a project: inside it,
    `load_config()` without --config refuses when no quiver.yaml is found instead of using defaults (and
    creating ./.quiver/ wherever it was run). Commands that need no project simply never load one.
    """

    @functools.wraps(func)
    def wrapper(*args: Any, **kwargs: Any) -> Any:
        try:
            with project_required():
                return func(*args, **kwargs)
        except CatalogError as exc:
            for problem in exc.problems:
                _error(str(problem))
            raise typer.Exit(2) from None
        except QuiverError as exc:
            _error(str(exc))
            raise typer.Exit(2) from None
        except Exception as exc:  # a registry database refusing (read-only, locked, gone): one line, no traceback
            from quiver.registry.errors import describe_database_error

            message = describe_database_error(exc)
            if message is None:
                raise
            _error(message)
            raise typer.Exit(2) from None

    return wrapper  # type: ignore[return-value]


class HintedGroup(TyperGroup):
    """A command group whose "No such command" also points at the command meant when the word is one a user
    would reasonably try (`quiver models promote`): Typer's own hint only catches typos of existing names."""

    hints: ClassVar[dict[str, str]] = {}

    def resolve_command(self, ctx: Any, args: list[str]) -> Any:
        try:
            return super().resolve_command(ctx, args)
        except typer.TyperException as exc:  # Typer's own copy of click's UsageError ("No such command")
            message = getattr(exc, "message", None)
            hint = self.hints.get(args[0]) if args else None
            if hint and isinstance(message, str) and "Did you mean" not in message:
                exc.message = f"{message.rstrip('.')}. {hint}"  # type: ignore[attr-defined]
            raise


PROMOTE_HINT = ("A version becomes champion through `quiver models alias set MODEL champion VERSION --expected "
                "CURRENT --reason …` (by hand), or through the loop's gates: `quiver canary start MODEL --version "
                "VERSION`.")


ROLLBACK_HINT = ("Roll back with `quiver models alias rollback MODEL --reason …` (champion → previous), or end a "
                 "running canary with `quiver canary rollback MODEL --reason …`.")


def hinted_group(hints: dict[str, str]) -> type[TyperGroup]:
    """A `HintedGroup` class for `typer.Typer(cls=...)`: unknown command word → the sentence that points at the
    real command (the group's own typo hint still wins where it has one)."""
    return type("HintedGroup", (HintedGroup,), {"hints": dict(hints)})


def with_cli_flags(exc: QuiverError, flags: dict[str, str]) -> QuiverError:
    """`exc` with the Python API's argument names (`timestamp_column=…`) replaced by the CLI's flags
    (`--timestamp-column NAME`): a CLI error names what the user can type."""
    message = str(exc)
    for argument, flag in flags.items():
        message = message.replace(argument, flag)
    return QuiverError(message) if message != str(exc) else exc


def _error(message: str) -> None:
    # User text ("[/x]" in a name) must not be read as Rich markup; one problem is one line.
    err_console.print(f"[red]error:[/red] {escape(' '.join(message.splitlines()))}", highlight=False,
                      soft_wrap=True)


def option_time(value: str | None, what: str) -> datetime | None:
    """An ISO date or time given to option `what` (naive: UTC); None when not given."""
    if not value:
        return None
    try:
        moment = datetime.fromisoformat(value)
    except ValueError:
        raise QuiverError(f"{what} must be an ISO date or time (e.g. 2026-11-03T12:00), got {value!r}") from None
    return moment if moment.tzinfo else moment.replace(tzinfo=UTC)


def split_names(values: list[str] | None) -> list[str] | None:
    """`--view a --view b,c` → ["a", "b", "c"]; None when none was given."""
    names = [v.strip() for item in values or [] for v in item.split(",") if v.strip()]
    return names or None


def open_project(config_path: Path | None, catalog_dir: Path | None = None) -> tuple[Config, Catalog]:
    """Config and the catalog every reading command uses: the registry's current version (`quiver apply` is
    the gate); the definitions on disk only while nothing was applied yet."""
    config, applied = open_applied(config_path, catalog_dir)
    return config, applied.catalog


def open_applied(config_path: Path | None, catalog_dir: Path | None = None) -> tuple[Config, Any]:
    """Config and `AppliedCatalog` (catalog, registry version or None, whether the disk differs). An explicit
    `--catalog` folder is read as it is (a preview of definitions not applied), never the registry's."""
    from quiver.registry.repository import AppliedCatalog, load_applied_catalog

    config = load_config(config_path)
    if catalog_dir is not None:
        return config, AppliedCatalog(load_catalog(catalog_dir, root=config.root), None)
    return config, load_applied_catalog(config)


def open_disk_project(config_path: Path | None, catalog_dir: Path | None = None) -> tuple[Config, Catalog]:
    """Config and the validated definitions on disk (what `plan` and `apply` compare with the registry)."""
    config = load_config(config_path)
    directory = catalog_dir or config.catalog_dir
    return config, load_catalog(directory, root=config.root)


def open_registry(config: Config) -> Any:
    from quiver.registry import Registry

    return Registry(config.registry, project=config.project)


def catalog_label(applied: Any, catalog_dir: Path | None = None) -> str:
    """One line saying which catalog a command uses (an `AppliedCatalog` from `open_applied`)."""
    if catalog_dir is not None:
        return f"catalog: definitions in {catalog_dir} as they are (--catalog), not the applied version"
    if applied.version is None:
        return "catalog: definitions on disk (nothing applied yet: run `quiver apply`)"
    return (f"catalog version {applied.version} (applied)"
            + ("; the definitions on disk differ: see `quiver plan`" if applied.disk_differs else ""))
