"""Prediction serving: req/s and p50/p99 latency of `quiver serve-model` vs the service a Feast user writes.

Both sides serve the same torch model (one real artifact: a TabularNet over 50 float features, loaded by
`quiver.models.artifact.load_model`) on the same data (N users × 50 float64 features, one view) in one
redis-server this script starts. Quiver: `quiver serve-model` (FastAPI, online features in one store call,
serving logs written, registry polled) in champion-only, champion + shadow, and canary-at-50 % setups. The
peer: a FastAPI endpoint calling Feast 0.67's `get_online_features` and then the same model — what a Feast
user writes, champion only. Each server is its own process with one uvicorn worker and one torch thread;
the same client (a few threads, one keep-alive connection each, a minimal HTTP/1.1 client so that it
measures the servers rather than itself) drives each setup for the same duration, at 1 and 100 rows per
request; setups alternate round by round. Both sides must return the same scores for sampled rows (and
every reply one prediction per row), else the script fails.

    python benchmarks/predict.py [--quick] [--no-targets] [--off-path process|thread]
Last line: RESULT predict ratio=<Quiver req/s (champion + shadow) / peer req/s, 1 row> quiver=<req/s>req/s
           peer=<req/s>req/s
Targets: ≥ 3× the peer's req/s at 1 row, ≥ 10× at 100 rows; the shadow adds ≤ 10 % to the champion's p99
(exit 1 when one is missed, unless --no-targets). Every setup's answers are checked when it starts: each
sampled row's score must equal the version it names, called directly; and the run fails when the server
dropped any shadow or paired row (the shadow must do all its work). The server scores the shadow in its own
process (`serve-model`'s default `--off-path process`).
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import textwrap
import threading
import time
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd
import pyarrow as pa
import pyarrow.parquet as pq

HERE = Path(__file__).resolve().parent
ROOT = HERE.parent
sys.path[:0] = [str(HERE), str(ROOT), str(ROOT / "platform")]
RESULTS = HERE / "results"
KEY = "bench-key"
MODEL = "bench_model"

from _http_client import KeepAliveClient  # noqa: E402
from http_server import DEFS, free_port, stop, wait_http  # noqa: E402
from online_read import F, feast_setup, quiver_setup, user_frame  # noqa: E402

PEER_APP = """
import os, sys
sys.path[:0] = {paths!r}
import torch
torch.set_num_threads(1)
from fastapi import FastAPI
from pydantic import BaseModel
from feast import FeatureStore
from quiver.models.artifact import load_model

store = FeatureStore(repo_path={repo!r})
model = load_model({artifact!r})
FEATURES = {features!r}
app = FastAPI()


class Row(BaseModel):
    request_id: str
    entities: dict[str, int]
    fields: dict[str, float] = {{}}  # request fields, for on-demand feature views (predict_request.py)


class Body(BaseModel):
    rows: list[Row]


@app.post("/predict")
def predict(body: Body) -> dict:
    values = store.get_online_features(features=FEATURES,
                                       entity_rows=[{{**r.entities, **r.fields}} for r in body.rows]).to_dict()
    scores = model.predict({{name: values[name] for name in model.features}})
    return {{"predictions": [{{"request_id": r.request_id, "score": float(s)}}
                             for r, s in zip(body.rows, scores)]}}


@app.get("/health")
def health() -> dict:
    return {{"status": "ok"}}
"""


def save_models(root: Path) -> list[tuple[Path, str]]:
    """Three real artifacts (champion, shadow, canary) over f0..f49."""
    import torch

    from quiver.models.artifact import save_artifact
    from quiver.models.network import NetworkConfig, TabularNet
    from quiver.models.scoring import Preprocessor

    names = tuple(f"f{i}" for i in range(F))
    prep = Preprocessor(names, (), (0.5,) * F, (0.29,) * F, ())
    out = []
    for seed in (1, 2, 3):
        torch.manual_seed(seed)
        net = TabularNet(NetworkConfig(n_numeric=F, cardinalities=(), hidden=(64, 32), dropout=0.0))
        reference = pd.DataFrame({n: np.random.default_rng(seed).random(100) for n in names}).assign(score=0.5)
        out.append(save_artifact(root, MODEL, net, prep, feature_refs=[f"v:{n}" for n in names],
                                 catalog_version=None, catalog_hash="bench", label_column="label",
                                 reference=reference))
    return out


def quiver_project(root: Path, url: str, frame: pd.DataFrame, defs: str = DEFS) -> Any:
    """Project files, registry with the three versions; returns the ModelRegistry."""
    from quiver.registry import Registry
    from quiver.registry.models import ModelRegistry

    (root / "feature_defs").mkdir(parents=True)
    (root / "feature_defs" / "defs.py").write_text(defs)
    (root / "data").mkdir()
    pq.write_table(pa.Table.from_pandas(frame.head(10), preserve_index=False), root / "data" / "events.parquet")
    (root / "quiver.yaml").write_text(f"project: bench\nregistry_url: sqlite:///reg.db\nredis_url: {url}\n")
    from quiver.artifacts import ArtifactStore

    # Artifacts under the project's default artifact root (.quiver): the registry records keys relative to it.
    models = ModelRegistry(Registry(f"sqlite:///{root}/reg.db", project="bench"), ArtifactStore(root / ".quiver"))
    now = datetime.now(UTC)
    for folder, sha in save_models(root / ".quiver" / "models"):
        models.register(MODEL, artifact_path=str(folder), sha256=sha, metrics={"roc_auc": 0.7, "baseline": {"roc_auc": 0.6}}, window_start=now - timedelta(days=7),
                        cutoff=now, features=[f"f{i}" for i in range(F)], catalog_version=None, label_column="label",
                        lineage={}, reference_path=str(folder / "reference.parquet"))
    models.set_alias(MODEL, "champion", 1, expected=None, reason="benchmark")
    return models


def start_quiver(root: Path, micro_batch: bool = False, model: str = MODEL,
                 off_path: str = "process") -> tuple[subprocess.Popen[bytes], str]:
    port = free_port()
    env = {**os.environ, "QUIVER_API_KEY": KEY}
    proc = subprocess.Popen([sys.executable, "-c", "from quiver.cli import main; main()", "serve-model", model,
                             "--port", str(port), "--config", str(root / "quiver.yaml"), "--poll-interval", "0.2",
                             "--micro-batch" if micro_batch else "--no-micro-batch", "--off-path", off_path],
                            cwd=root, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    return proc, f"http://127.0.0.1:{port}"


def start_peer(folder: Path, repo: Path, artifact: Path, features: list[str] | None = None,
               name: str = "peer_app") -> tuple[subprocess.Popen[bytes], str]:
    """The peer: FastAPI + Feast's `get_online_features` + the same model (`features`: Feast references)."""
    (folder / f"{name}.py").write_text(PEER_APP.format(
        paths=[str(ROOT), str(ROOT / "platform"), str(repo)], repo=str(repo), artifact=str(artifact),
        features=features or [f"v:f{i}" for i in range(F)]))
    port = free_port()
    proc = subprocess.Popen([sys.executable, "-m", "uvicorn", f"{name}:app", "--port", str(port), "--workers", "1",
                             "--no-access-log", "--log-level", "warning"], cwd=folder,
                            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    return proc, f"http://127.0.0.1:{port}"


def body(users: list[int], tag: str) -> dict[str, Any]:
    return {"rows": [{"request_id": f"{tag}-{i}", "entities": {"user_id": u}} for i, u in enumerate(users)]}


def load(base: str, headers: dict[str, str], n_entities: int, rows: int, seconds: float,
         concurrency: int, make_body: Any = body) -> tuple[int, float, list[float]]:
    """Drive `base` for `seconds` with `concurrency` threads; (requests, wall seconds, latencies).

    Every reply must be a 200 holding one prediction per row, else the run fails."""
    latencies: list[float] = []
    errors: list[str] = []
    lock = threading.Lock()
    deadline = time.perf_counter() + seconds

    def worker(seed: int) -> None:
        rng = np.random.default_rng(seed)
        mine: list[float] = []
        client = KeepAliveClient(base, headers)
        try:
            k = 0
            while time.perf_counter() < deadline:
                payload = json.dumps(make_body(rng.integers(0, n_entities, rows).tolist(), f"w{seed}-{k}")).encode()
                t = time.perf_counter()
                status, answer = client.post(payload)
                mine.append(time.perf_counter() - t)
                if status != 200 or answer.count(b'"request_id"') != rows:
                    raise RuntimeError(f"{base}: {status} {answer[:200]!r}")
                k += 1
        except Exception as exc:
            with lock:
                errors.append(f"{type(exc).__name__}: {exc}")
        finally:
            client.close()
        with lock:
            latencies.extend(mine)

    threads = [threading.Thread(target=worker, args=(seed,)) for seed in range(concurrency)]
    began = time.perf_counter()
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    if errors:
        raise RuntimeError(f"load on {base} failed: {errors[0]}")
    return len(latencies), time.perf_counter() - began, latencies


def configure(models: Any, base: str, setup: str) -> None:
    """Move aliases / the rollout for `setup` and wait until the server serves it."""
    import httpx

    from quiver.registry import rollouts

    registry = models.registry
    aliases = models.aliases(MODEL)
    running = rollouts.active_rollout(registry, MODEL)
    if running is not None:
        rollouts.finish_rollout(registry, running.id, rollouts.ROLLED_BACK, fraction=0.0)
    for alias in ("shadow", "canary"):
        if aliases.get(alias) is not None:
            models.set_alias(MODEL, alias, None, expected=aliases[alias], reason="benchmark setup")
    want: dict[str, Any] = {"shadow": None, "canary": None}
    if setup == "shadow":
        models.set_alias(MODEL, "shadow", 2, expected=None, reason="benchmark setup")
        want["shadow"] = f"{MODEL}:2"
    elif setup == "canary":
        models.set_alias(MODEL, "canary", 3, expected=None, reason="benchmark setup")
        rollouts.start_rollout(registry, MODEL, champion_version=1, canary_version=3, fraction=0.5, settings={},
                               salt="bench")
        want["canary"] = f"{MODEL}:3"
    for _ in range(300):
        health = httpx.get(base + "/health").json()
        if all(health.get(k) == v for k, v in want.items()):
            return
        time.sleep(0.05)
    raise RuntimeError(f"server did not switch to {setup}: {health}")


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--quick", action="store_true", help="small sizes, under a minute")
    parser.add_argument("--concurrency", type=int, default=4)
    parser.add_argument("--no-targets", action="store_true", help="report, but exit 0 when a target is missed")
    parser.add_argument("--off-path", choices=("process", "thread"), default="process",
                        help="where the Quiver servers score the shadow (`serve-model --off-path`)")
    args = parser.parse_args()
    n_entities = 1_000 if args.quick else 10_000  # Feast materializes ~1k entities/s: keep its setup short
    # Quick: three short rounds rather than one long one, so the peer's place and a slow second move it less.
    seconds = 0.6 if args.quick else 6.0
    rounds = 3

    import httpx

    from quiver.models.artifact import load_model
    from quiver.online.embedded import LocalRedis

    rng = np.random.default_rng(11)
    frame = user_frame(n_entities, rng)
    report: dict[str, Any] = {"entities": n_entities, "features": F, "concurrency": args.concurrency,
                              "off_path": args.off_path,
                              "seconds_per_run": seconds, "rounds": rounds, "quick": args.quick,
                              "micro_batching": "off (the default) in every Quiver setup but champion_micro_batch: "
                                                "the same champion-only server started with --micro-batch "
                                                "(not run with --quick)"}
    began = time.perf_counter()
    setups = ("champion", "shadow", "canary")
    results: dict[str, dict[int, list[Any]]] = {s: {1: [0, 0.0, []], 100: [0, 0.0, []]}
                                                for s in (*setups, "champion_micro_batch", "peer")}
    with LocalRedis() as url, tempfile.TemporaryDirectory() as tmp:
        tmp_path = Path(tmp)
        sdk, _, _ = quiver_setup(url, frame)
        sdk.close()
        models = quiver_project(tmp_path / "quiver", url, frame)
        champion = models.get(MODEL, 1)
        # The Quiver server starts (imports torch, FastAPI, …) while Feast materializes: a shorter setup.
        quiver_proc, quiver_base = start_quiver(tmp_path / "quiver", off_path=args.off_path)
        # --quick leaves out the --micro-batch variant (off by default; not part of the comparison): one
        # process fewer importing torch on two cores is most of what keeps --quick under a minute.
        batched = None if args.quick else start_quiver(tmp_path / "quiver", micro_batch=True, off_path=args.off_path)
        feast_setup(url, frame, tmp_path / "feast")
        peer_proc, peer_base = start_peer(tmp_path, tmp_path / "feast", models.artifacts.local_dir(champion.artifact_path))
        headers = {"X-API-Key": KEY}
        try:
            wait_http(quiver_base + "/health", quiver_proc)
            if batched is not None:
                wait_http(batched[1] + "/health", batched[0])
            wait_http(peer_base + "/health", peer_proc)
            report["setup_s"] = time.perf_counter() - began
            scorers = {f"{MODEL}:{v}": load_model(models.artifacts.local_dir(models.get(MODEL, v).artifact_path))
                       for v in (1, 2, 3)}

            def check(base: str, headers: dict[str, str], setup: str) -> None:
                """100 sampled rows: each score equals the version it names, called directly."""
                users = rng.integers(0, n_entities, 100).tolist()
                reply = httpx.post(base + "/predict", json=body(users, f"check-{setup}"), headers=headers).json()
                columns = {f"f{i}": frame[f"f{i}"].to_numpy()[users] for i in range(F)}
                served = reply["predictions"]
                versions = [p.get("model_version", f"{MODEL}:1") for p in served]  # the peer: champion only
                for version in sorted(set(versions)):
                    # The rows one version scored, as one batch in their order: what the server ran.
                    rows_of = np.flatnonzero(np.array(versions) == version)
                    want = scorers[version].predict({k: v[rows_of] for k, v in columns.items()})
                    got = np.array([served[i]["score"] for i in rows_of])
                    if not np.allclose(got, want, rtol=0, atol=1e-7):
                        worst = int(np.abs(got - want).argmax())
                        raise SystemExit(f"MISMATCH in {setup}: row {rows_of[worst]} scored {got[worst]} by "
                                         f"{version}, the model says {want[worst]}")

            check(quiver_base, headers, "champion")
            check(peer_base, {}, "peer")
            report["same_answers"] = True
            for rows in (1, 100):  # warm up both
                load(quiver_base, headers, n_entities, rows, seconds / 3, args.concurrency)
                load(peer_base, {}, n_entities, rows, seconds / 3, args.concurrency)
            for r in range(rounds):
                # The peer takes a different place in each round: first, between, last.
                order: list[str] = list(setups)
                order.insert(r % (len(setups) + 1), "peer")
                for setup in order:
                    if setup == "peer":
                        for rows in (1, 100):
                            n, wall, lat = load(peer_base, {}, n_entities, rows, seconds, args.concurrency)
                            acc = results["peer"][rows]
                            acc[0], acc[1] = acc[0] + n, acc[1] + wall
                            acc[2].extend(lat)
                        continue
                    configure(models, quiver_base, setup)
                    check(quiver_base, headers, setup)
                    for rows in (1, 100):
                        n, wall, lat = load(quiver_base, headers, n_entities, rows, seconds, args.concurrency)
                        acc = results[setup][rows]
                        acc[0], acc[1] = acc[0] + n, acc[1] + wall
                        acc[2].extend(lat)
                    if setup == "champion" and batched is not None:  # the same, started with --micro-batch
                        configure(models, batched[1], setup)
                        check(batched[1], headers, "champion_micro_batch")
                        for rows in (1, 100):
                            n, wall, lat = load(batched[1], headers, n_entities, rows, seconds, args.concurrency)
                            acc = results["champion_micro_batch"][rows]
                            acc[0], acc[1] = acc[0] + n, acc[1] + wall
                            acc[2].extend(lat)
            report["quiver_server_metrics"] = [line for line in httpx.get(quiver_base + "/metrics").text.splitlines()
                                               if line.startswith("quiver_prediction_rows")]
            report["off_path_health"] = httpx.get(quiver_base + "/health").json().get("off_path")
            # The same work on both sides: a shadow that dropped rows to keep up would flatter its p99.
            counters = {line.split('"')[1]: float(line.rsplit(" ", 1)[1]) for line in report["quiver_server_metrics"]}
            if counters.get("shadow_dropped", 0) or counters.get("paired_dropped", 0) or not counters.get("shadow_rows"):
                raise SystemExit(f"the off-path work was not all done: {counters}")
        finally:
            stop(quiver_proc)
            if batched is not None:
                stop(batched[0])
            stop(peer_proc)
    if batched is None:
        del results["champion_micro_batch"]
    for name, by_rows in results.items():
        report[name] = {}
        for rows, (n, wall, lat) in by_rows.items():
            arr = np.array(lat) * 1e3
            report[name][f"{rows}_rows"] = {"requests": n, "rps": n / wall, "p50_ms": float(np.percentile(arr, 50)),
                                            "p99_ms": float(np.percentile(arr, 99))}
            r = report[name][f"{rows}_rows"]
            print(f"{name:>20} {rows:>3} rows: {r['rps']:7.0f} req/s  p50 {r['p50_ms']:7.2f} ms  "
                  f"p99 {r['p99_ms']:7.2f} ms  ({n} requests)")
    ratios = {f"{rows}_rows": report["shadow"][f"{rows}_rows"]["rps"] / report["peer"][f"{rows}_rows"]["rps"]
              for rows in (1, 100)}
    shadow_p99 = {f"{rows}_rows": report["shadow"][f"{rows}_rows"]["p99_ms"] / report["champion"][f"{rows}_rows"]["p99_ms"]
                  for rows in (1, 100)}
    report["ratio_rps_shadow_vs_peer"] = ratios
    report["shadow_p99_over_champion_p99"] = shadow_p99
    report["targets"] = {"rps_1_row_min": 3.0, "rps_100_rows_min": 10.0, "shadow_p99_max": 1.10,
                         "met": {"1_row": ratios["1_rows"] >= 3.0, "100_rows": ratios["100_rows"] >= 10.0,
                                 "shadow_p99": max(shadow_p99.values()) <= 1.10}}
    report["load_average"] = os.getloadavg()
    report["note"] = "measured on a busy shared 2-core machine; client and servers share the cores"
    if "champion_micro_batch" in report:
        gain = {f"{rows}_rows": report["champion_micro_batch"][f"{rows}_rows"]["rps"]
                / report["champion"][f"{rows}_rows"]["rps"] for rows in (1, 100)}
        report["micro_batch_gain_rps"] = gain
        print(f"micro-batching (champion req/s on / off): {gain['1_rows']:.2f} at 1 row, "
              f"{gain['100_rows']:.2f} at 100 rows")
    report["total_s"] = time.perf_counter() - began
    RESULTS.mkdir(exist_ok=True)
    (RESULTS / "predict.json").write_text(json.dumps(report, indent=2))
    print(textwrap.dedent(f"""\
        ratio vs peer (champion + shadow): {ratios['1_rows']:.1f}x at 1 row, {ratios['100_rows']:.1f}x at 100 rows
        shadow p99 / champion p99: {shadow_p99['1_rows']:.2f} at 1 row, {shadow_p99['100_rows']:.2f} at 100 rows"""))
    met = report["targets"]["met"]
    if not all(met.values()):
        print(f"TARGET MISSED: {', '.join(k for k, v in met.items() if not v)} (targets: ≥ 3x the peer at 1 row, "
              f"≥ 10x at 100 rows, shadow p99 ≤ 1.10x the champion's)")
    print(f"RESULT predict ratio={ratios['1_rows']:.1f} quiver={report['shadow']['1_rows']['rps']:.0f}req/s "
          f"peer={report['peer']['1_rows']['rps']:.0f}req/s")
    return 0 if all(met.values()) or args.no_targets else 1


if __name__ == "__main__":
    sys.exit(main())
