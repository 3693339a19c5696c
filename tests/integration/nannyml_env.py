"""A virtual environment of its own for NannyML, the reference CBPE implementation the tests compare with.

nannyml's pins conflict with the project's venv, so it lives in `.venv-nannyml` at the repository root,
created on first use (`uv venv` + `uv pip install` when uv is on PATH or in .venv/bin, else `python -m venv`
+ pip) from the same Python as .venv, and reused while its marker names the same packages. A file lock keeps
parallel test workers from building it twice. Code runs there as a script in a subprocess.
"""

from __future__ import annotations

import fcntl
import shutil
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
VENV = ROOT / ".venv-nannyml"
# nannyml 0.13.1 imports statsmodels (its plots) without declaring it as a dependency
PACKAGES = ("nannyml==0.13.1", "statsmodels")
_MARKER = VENV / ".quiver-packages"


def nannyml_python() -> Path:
    """The interpreter of the NannyML venv, built first when missing or built for other packages."""
    python = VENV / "bin" / "python"
    wanted = "\n".join(PACKAGES)
    if python.exists() and _MARKER.exists() and _MARKER.read_text() == wanted:
        return python
    ROOT.joinpath(".quiver").mkdir(exist_ok=True)
    with open(ROOT / ".quiver" / "nannyml-venv.lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)  # released when the file closes
        if python.exists() and _MARKER.exists() and _MARKER.read_text() == wanted:
            return python  # another worker built it while this one waited
        shutil.rmtree(VENV, ignore_errors=True)
        base = getattr(sys, "_base_executable", sys.executable)  # .venv's own Python, not the venv's shim
        uv = shutil.which("uv") or next((str(p) for p in [ROOT / ".venv" / "bin" / "uv"] if p.exists()), None)
        if uv:
            _run([uv, "venv", "--python", base, str(VENV)])
            _run([uv, "pip", "install", "--python", str(python), *PACKAGES])
        else:
            _run([base, "-m", "venv", str(VENV)])
            _run([str(python), "-m", "pip", "install", "--quiet", "--disable-pip-version-check", *PACKAGES])
        _MARKER.write_text(wanted)
    return python


def run_nannyml_script(script: Path, *args: str, timeout: float = 600) -> str:
    """Run `script` with the NannyML venv's Python; its stdout, or an error carrying its stderr."""
    done = subprocess.run([str(nannyml_python()), str(script), *args], capture_output=True, text=True,
                          timeout=timeout, cwd=script.parent)
    if done.returncode != 0:
        raise RuntimeError(f"{script.name} failed in {VENV.name} (exit {done.returncode}):\n{done.stderr[-4000:]}")
    return done.stdout


def _run(command: list[str]) -> None:
    done = subprocess.run(command, capture_output=True, text=True, timeout=900)
    if done.returncode != 0:
        raise RuntimeError(f"building {VENV.name}: {' '.join(command)} failed (exit {done.returncode}):\n"
                           f"{done.stderr[-4000:]}")
