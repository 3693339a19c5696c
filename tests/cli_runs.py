"""Run `quiver` in a project folder as a user would (shared by CLI tests): `quiver()` in this process, for
arguments, messages, exit codes and outputs; `quiver_process()` as the installed executable, where the process
boundary itself is the subject. Both return the same `CompletedProcess` (returncode, stdout, stderr)."""

from __future__ import annotations

import contextlib
import logging
import os
import signal
import subprocess
import sys
import threading
import traceback
import warnings
from collections.abc import Iterator, Mapping
from pathlib import Path
from typing import Any

QUIVER = Path(sys.executable).parent / "quiver"
COLUMNS = "250"  # wide enough for whole tables

# A fresh interpreter's warning filters (`python -c "import warnings; print(warnings.filters)"`), not the ones
# pytest installs for the test around the call.
_INTERPRETER_FILTERS: tuple[tuple[Any, type[Warning], str], ...] = (
    ("default", DeprecationWarning, "__main__"), ("ignore", DeprecationWarning, ""),
    ("ignore", PendingDeprecationWarning, ""), ("ignore", ImportWarning, ""), ("ignore", ResourceWarning, ""))


def quiver_process(*args: str, cwd: Path, timeout: float = 300,
                   env: Mapping[str, str] | None = None) -> subprocess.CompletedProcess[str]:
    """`quiver *args` as the installed executable in `cwd`, without the caller's QUIVER_* settings, COLUMNS=250,
    plus `env`."""
    environ = {k: v for k, v in os.environ.items() if not k.startswith("QUIVER_")} | {"COLUMNS": COLUMNS}
    return subprocess.run([str(QUIVER), *args], cwd=cwd, env=environ | dict(env or {}), capture_output=True,
                          text=True, timeout=timeout)


def quiver(*args: str, cwd: Path, timeout: float = 300,
           env: Mapping[str, str] | None = None) -> subprocess.CompletedProcess[str]:
    """`quiver *args` run in this process as the executable runs it: in `cwd`, without QUIVER_* settings,
    COLUMNS=250 plus `env`, exit code as the interpreter would set it, an uncaught exception's traceback on
    stderr; raises `subprocess.TimeoutExpired` after `timeout` seconds."""
    if "QUIVER_METRICS_EXPORT" in (env or {}):
        # main() exports when the process ends, which a run in this process never does: say so, never skip it.
        raise ValueError("QUIVER_METRICS_EXPORT acts at process exit: use quiver_process()")
    from typer.testing import CliRunner

    from quiver.cli import app

    _register_commands()
    overrides: dict[str, str | None] = {k: None for k in os.environ if k.startswith("QUIVER_")}
    overrides |= {"COLUMNS": COLUMNS, **(env or {})}
    command = command_of(app)
    try:
        with _restored_process_state(cwd, timeout, [str(QUIVER), *args]), \
                CliRunner().isolation(env=overrides) as (stdout, stderr, _), _fresh_consoles(), _fresh_warnings():
            try:
                command.main(args=list(args), prog_name="quiver")
                code = 0
            except SystemExit as exc:
                code = _exit_status(exc.code)
            except Exception:
                traceback.print_exc()  # to the captured stderr, as the interpreter prints an uncaught error
                code = 1
            finally:
                sys.stdout.flush()
                sys.stderr.flush()
            out, err = stdout.getvalue().decode(), stderr.getvalue().decode()
    except _Timeout:
        raise subprocess.TimeoutExpired(["quiver", *args], timeout) from None
    return subprocess.CompletedProcess(["quiver", *args], code, out, err)


def done(result: subprocess.CompletedProcess[str], code: int = 0) -> str:
    """The output of a run that exited with `code` and no traceback."""
    assert result.returncode == code, f"exit {result.returncode}\n{result.stdout}\n{result.stderr}"
    assert "Traceback" not in result.stderr
    return result.stdout


_registered = False


_COMMANDS: dict[tuple[Any, int, int], Any] = {}


def command_of(app: Any) -> Any:
    """The Click command of a Typer app, built once per process and set of commands, as the executable builds it
    once per run: Typer rebuilds the whole tree (type hints of every command) on each call, ~0.3 s here."""
    from typer.main import get_command

    # The app itself in the key (by identity), not id(app): a test's throwaway app, once collected, could
    # leave its id to a new app and hand that one the old app's commands.
    key = (app, len(app.registered_commands), len(app.registered_groups))
    if key not in _COMMANDS:
        _COMMANDS[key] = get_command(app)
    return _COMMANDS[key]


def _register_commands() -> None:
    # `main()` registers the optional command groups on every start; once is enough in one process (each
    # registration adds the groups again).
    global _registered
    if not _registered:
        from quiver.cli import _register_optional_commands

        _register_optional_commands()
        _registered = True


def _exit_status(code: object) -> int:
    # What the interpreter does with SystemExit: None is 0, an int is itself, anything else is printed, status 1.
    if code is None:
        return 0
    if isinstance(code, int):
        return code
    print(code, file=sys.stderr)
    return 1


class _Timeout(BaseException):
    """The call ran past its timeout (a BaseException, so the command's `except Exception` cannot keep it)."""


@contextlib.contextmanager
def _restored_process_state(cwd: Path, timeout: float, argv: list[str]) -> Iterator[None]:
    """Working directory, argv, environment, sys.path and root logging as a fresh process has them, for the
    call; all put back afterwards, so one run cannot change the next."""
    previous_cwd, previous_argv, environ, path = os.getcwd(), sys.argv, dict(os.environ), list(sys.path)
    root = logging.getLogger()
    handlers, level = root.handlers[:], root.level
    # No root handlers: warnings from quiver's loggers reach stderr through logging.lastResort, as in a fresh
    # interpreter (pytest's capture handlers would swallow them).
    root.handlers, root.level = [], logging.WARNING
    timer = _deadline(timeout)
    os.chdir(cwd)
    sys.argv = argv
    try:
        with timer:
            yield
    finally:
        os.chdir(previous_cwd)
        sys.argv = previous_argv
        for key in set(os.environ) - set(environ):
            del os.environ[key]
        os.environ.update({k: v for k, v in environ.items() if os.environ.get(k) != v})
        sys.path[:] = path
        root.handlers, root.level = handlers, level


@contextlib.contextmanager
def _deadline(seconds: float) -> Iterator[None]:
    # SIGALRM only reaches the main thread; elsewhere (pytest-xdist runs tests in the main thread) no limit.
    if threading.current_thread() is not threading.main_thread():
        yield
        return

    def expire(_signum: int, _frame: object) -> None:
        raise _Timeout

    previous = signal.signal(signal.SIGALRM, expire)
    signal.setitimer(signal.ITIMER_REAL, seconds)
    try:
        yield
    finally:
        signal.setitimer(signal.ITIMER_REAL, 0)
        signal.signal(signal.SIGALRM, previous)


@contextlib.contextmanager
def _fresh_consoles() -> Iterator[None]:
    """quiver.cli's Rich consoles as a fresh process builds them, for the call. They are made at import, when
    the width (COLUMNS, else 200 when piped) and the colour system are read: here that was pytest's import."""
    from rich.console import Console

    from quiver import cli

    consoles = (cli.console, cli.err_console)
    saved = [dict(console.__dict__) for console in consoles]
    for console in consoles:
        # COLUMNS is always set for a run, so cli.py passes width=None and Rich reads it, here as there.
        console.__dict__.update(Console(stderr=console.stderr).__dict__)
    try:
        yield
    finally:
        for console, state in zip(consoles, saved, strict=True):
            console.__dict__.clear()
            console.__dict__.update(state)


@contextlib.contextmanager
def _fresh_warnings() -> Iterator[None]:
    """Warnings filtered as in a fresh interpreter and printed to the (captured) stderr, as it prints them."""

    def show(message: Warning | str, category: type[Warning], filename: str, lineno: int, file: Any = None,
             line: str | None = None) -> None:
        sys.stderr.write(warnings.formatwarning(message, category, filename, lineno, line))

    with warnings.catch_warnings():
        warnings.resetwarnings()
        for action, category, module in reversed(_INTERPRETER_FILTERS):
            warnings.filterwarnings(action, category=category, module=module)
        warnings.showwarning = show
        yield
