"""The README's tour runs as written: every `$ …` line of its console blocks (the model half included:
train → serve → shadow → canary → decisions → console), and its Python example.

The commands run in order, as a new user would after `make demo`, in a copy of the demo project (the
example catalog, quiver.yaml, monitoring.yaml, and the venvs linked in) holding smaller demo data over the
first 17 of the demo's days (2026-11-01 … 2026-11-17, drift injected from 2026-11-09: every date the tour
uses). A command that the README says "exits 1" must exit 1; every other must exit 0 (its curl calls fail
on an HTTP error). The excerpt of `feature_defs/user_features.py` must match the real file,
and the error line the README shows must be the one the CLI prints for that typo.
"""

from __future__ import annotations

import contextlib
import json
import os
import re
import shutil
import signal
import subprocess
import warnings
from dataclasses import dataclass
from pathlib import Path

import pytest

from quiver.pipelines.demo_data import generate
from tests.cli_runs import quiver
from tests.harness import copy_demo_project

pytestmark = [pytest.mark.integration, pytest.mark.slow]

REPO = Path(__file__).resolve().parents[2]
README = REPO / "README.md"
FENCE = re.compile(r"^```(\w*)\n(.*?)^```", re.M | re.S)


@dataclass(frozen=True)
class Block:
    lang: str
    text: str


def blocks() -> list[Block]:
    return [Block(m.group(1), m.group(2)) for m in FENCE.finditer(README.read_text())]


def commands(block: Block) -> list[str]:
    """The `$ ` lines of a console block, with backslash continuations joined."""
    out: list[str] = []
    continuing = False
    for line in block.text.splitlines():
        if continuing:
            out[-1] += "\n" + line
        elif line.startswith("$ "):
            out.append(line[2:])
        else:
            continue
        continuing = line.rstrip().endswith("\\")
    return out


def script(cmds: list[str]) -> str:
    """One bash script per block (a background `&` and a later `kill $!` share it); each command's exit code
    is checked against what the README says."""
    lines = ["set -u"]
    for cmd in cmds:
        if cmd.rstrip().split("#")[0].rstrip().endswith("&"):
            lines.append(cmd)
            continue
        expected = 1 if "exits 1" in cmd else 0
        quoted = cmd.replace("'", "'\\''")
        lines += ["{", cmd, "}", f"rc=$?; if [ $rc -ne {expected} ]; then echo 'README command exited '$rc' "
                  f"(expected {expected}): {quoted}' >&2; exit 97; fi"]
    return "\n".join(lines) + "\n"


def test_readme_starts_with_make_demo_and_make_test() -> None:
    first = blocks()[0]
    assert first.lang == "bash" and first.text == "make demo\nmake test\n"
    assert README.read_text().startswith("# Quiver\n\n```bash\nmake demo\nmake test\n```\n")


def test_the_parser_sees_every_command() -> None:
    console = [c for b in blocks() if b.lang == "console" for c in commands(b)]
    assert len(console) >= 15 and all(c.startswith((".venv/bin/", "QUIVER_API_KEY=", "curl ", "kill ")) for c in console)
    curl = next(c for c in console if c.startswith("curl "))
    assert curl.count("\n") == 2 and "features/online" in curl  # continuation lines joined


@pytest.fixture(scope="module")
def project(tmp_path_factory: pytest.TempPathFactory) -> Path:
    root = tmp_path_factory.mktemp("readme")
    copy_demo_project(root)
    generate(root / "data", days=17, users=2_000, transactions_per_day=8_000, drift_from_day=8, late_fraction=0.01,
             malformed_fraction=0.001)
    yield root
    from quiver.config import load_config
    from quiver.online.embedded import stop_embedded

    stop_embedded(load_config(root / "quiver.yaml"))  # in case the tour failed before its `redis stop`


def env() -> dict[str, str]:
    keep = {k: v for k, v in os.environ.items() if not k.startswith("QUIVER_")}
    return keep | {"COLUMNS": "200", "SPARK_LOCAL_IP": "127.0.0.1"}


def _ends(text: str, size: int = 2500) -> str:
    """Head and tail of a long output: a Java error says its reason at the head, Python at the tail."""
    return text if len(text) <= 2 * size else f"{text[:size]}\n[… {len(text) - 2 * size:,} characters …]\n{text[-size:]}"


FLINK_REFUSED = "the Flink job could not run:"


def run_block(block: Block, cwd: Path, timeout_s: float = 420, rerun_refused_flink: bool = True) -> str:
    if block.lang == "console":
        argv = ["bash", "-c", script(commands(block))]
    else:
        argv = [str(cwd / ".venv" / "bin" / "python"), "-c", block.text + PYTHON_CHECKS]
    # Own process group: a block that hangs is killed with everything it started (a server, a Flink JVM).
    proc = subprocess.Popen(argv, cwd=cwd, env=env(), stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                            start_new_session=True)
    try:
        stdout, stderr = proc.communicate(timeout=timeout_s)
    except subprocess.TimeoutExpired:
        os.killpg(proc.pid, signal.SIGKILL)
        stdout, stderr = proc.communicate()
        pytest.fail(f"README block did not finish in {timeout_s:.0f} s:\n{block.text}\n--- stderr\n{_ends(stderr)}")
    finally:
        with contextlib.suppress(ProcessLookupError):
            os.killpg(proc.pid, signal.SIGTERM)  # leftovers of a block (none when it cleans up after itself)
    if proc.returncode != 0 and FLINK_REFUSED in stderr and rerun_refused_flink:
        # Flink's planner refused the tour's job once on CI (NullPointerException: metadataHandlerProvider, a
        # py4j/ThreadLocal race the runner now avoids, see quiver.streaming.job._one_java_thread). Its trigger is
        # timing, so the fix could not be proven on demand: the stream commands run once more (a fresh job
        # replays the stream files) and the warning quotes the first reason. A second refusal fails the test.
        reason = next(line for line in stderr.splitlines() if FLINK_REFUSED in line)
        warnings.warn(f"Flink refused the README's stream job; running it again. {reason}", stacklevel=1)
        rest = "".join(f"$ {c}\n" for c in commands(block) if "stream_producer" not in c)
        return run_block(Block(block.lang, rest), cwd, timeout_s, rerun_refused_flink=False)
    assert proc.returncode == 0, f"README block failed:\n{block.text}\n--- stdout\n{_ends(stdout)}\n" \
                                 f"--- stderr\n{_ends(stderr)}"
    assert "Traceback" not in stderr, _ends(stderr)
    return stdout


# Appended to the README's Python example: it must return real values for the demo data, not zeros/NaN.
PYTHON_CHECKS = """
assert len(train) == len(labels) and train["amount_count_24h"].gt(0).mean() > 0.5
_values = online.drop(columns=["user_id", "merchant_id"]).iloc[0]
assert _values.notna().mean() > 0.8, _values
assert online["credit_limit"].notna().all() and online["risk_score"].notna().all()
# Feast habits on the same store: entity_df= and .to_df()
pd.testing.assert_frame_equal(store.get_historical_features(entity_df=labels, features="fraud_model"), train)
_again = store.get_online_features("fraud_model", [{"user_id": 7, "merchant_id": 3}], at="2026-11-18T00:00:00Z",
                                   request={"amount": [42.0], "is_online": [True]})
assert _again.to_df().equals(_again.to_pandas())
print("README-PYTHON-OK")
"""


def test_readme_tour_runs_as_written(project: Path) -> None:
    outputs: list[tuple[Block, str]] = []
    for block in blocks():
        runnable = commands(block) if block.lang == "console" else block.lang == "python"
        if runnable and not block.text.startswith("# feature_defs/"):  # an excerpt is checked below instead
            outputs.append((block, run_block(block, project)))
    text = "\n".join(out for _, out in outputs)
    assert "no changes; catalog version 1 is current" in text or "applied catalog version 1" in text
    assert "user_spend" in text and "feature service" in text and "+ feature view user_spend" in text
    served = next(out for block, out in outputs if "features/online" in block.text)
    reply = json.loads(served[served.index("{"):served.rindex("}") + 1])
    assert reply["features"]["credit_limit"][0] is not None and "PRESENT" in reply["status"]["credit_limit"]
    assert "README-PYTHON-OK" in text
    assert "left out" in text and "user_id (join key)" in text and "(Evidently," in text
    assert (project / "data" / "reports" / "drift.summary.html").exists()
    assert (project / "data" / "events" / "transactions" / "date=2026-11-15" / "part-00000.parquet").exists()
    assert "finished (bounded" in text and "stopped the embedded Redis" in text
    # The model half: train → serve → shadow → canary → decisions, from the CLI alone.
    model = next(out for block, out in outputs if "tour_model" in block.text)
    assert "tour_model:1 registered" in model and "tour_model:2 registered" in model
    assert "serving tour_model" in model and '"model_version":"tour_model:1"' in model.replace(" ", "")
    assert re.search(r"wrote [1-9][\d,]* labels", model), model
    assert "verdict not worse" in model or "verdict better" in model  # the same weights: not worse
    assert "gets canary share 0.5" in model and "(dry run: nothing recorded)" in model
    # Every canary row was paired while serving (the replay scored them), so the judge replays none.
    assert re.search(r"[1-9][\d,]* paired while serving, 0 replayed by the judge", model), model
    assert "estimate (canary − champion)" in model and "confidence sequence" in model
    assert "why: registered" in model and "[95 %]" in model and "score" in model
    page = (project / "data" / "reports" / "console-model.html").read_text()
    assert "Model tour_model" in page and "Alias history" in page
    assert (project / "data" / "reports" / "tour-drift.summary.html").exists()


def test_readme_excerpt_and_error_line_are_real(tmp_path: Path) -> None:
    excerpt = next(b for b in blocks() if b.lang == "python" and b.text.startswith("# feature_defs/"))
    source = excerpt.text.splitlines()[0].split()[1]
    real = (REPO / source).read_text()
    calls = re.findall(r"Aggregation\([^)]*\)", excerpt.text)
    assert calls and all(call in real for call in calls)
    [error] = [line for b in blocks() if b.lang == "text" for line in b.text.splitlines() if line.startswith("error:")]
    shutil.copytree(REPO / "feature_defs", tmp_path / "feature_defs", ignore=shutil.ignore_patterns("__pycache__"))
    shutil.copy(REPO / "quiver.yaml", tmp_path / "quiver.yaml")
    generate(tmp_path / "data", days=1, users=20, transactions_per_day=50)
    defs = tmp_path / "feature_defs" / "user_features.py"
    defs.write_text(defs.read_text().replace('Aggregation("amount", "mean", "24h")', 'Aggregation("amout", "mean", "24h")'))
    result = quiver("plan", cwd=tmp_path, timeout=120, env={"COLUMNS": "200"})  # a message: in process
    assert result.returncode == 2 and result.stderr.strip() == error
