"""Model quality with and without request-time features: the demo's network and its logistic baseline.

Two copies of the example project on the same generated data (the demo's generator, seed 7): one with the
fraud service as shipped, one without its on-demand view (`transaction_context`: the transaction's amount,
its ratio to the user's usual spend, online or not, hour, night). Each is backfilled and trained with the
same window, cutoff, time split (train / validation / test), seed and knowledge time; the logistic-regression
baseline gets the same inputs as the network. Every metric is on the test window, which neither model
selected on.

    python benchmarks/model_quality.py [--quick]
Last line: RESULT model_quality ratio=<log loss without / with request features (network)>
           quiver=<ROC-AUC with> peer=<baseline ROC-AUC with>
"""

from __future__ import annotations

import argparse
import json
import shutil
import sys
import tempfile
import time
from datetime import date, timedelta
from pathlib import Path
from typing import Any

HERE = Path(__file__).resolve().parent
ROOT = HERE.parent
sys.path[:0] = [str(ROOT), str(ROOT / "platform")]
RESULTS = HERE / "results"
START = date(2026, 11, 1)
KEYS = ("roc_auc", "pr_auc", "log_loss", "brier")


def project(root: Path, with_request_features: bool) -> Path:
    """A copy of the example project; without request features, the service drops its on-demand view."""
    shutil.copytree(ROOT / "feature_defs", root / "feature_defs", ignore=shutil.ignore_patterns("__pycache__"))
    shutil.copy(ROOT / "quiver.yaml", root / "quiver.yaml")
    if not with_request_features:
        services = root / "feature_defs" / "services.py"
        text = services.read_text()
        stripped = text.replace("from request_features import transaction_context\n", "").replace(
            ",\n              transaction_context]", "]")
        if stripped == text:
            raise SystemExit("model_quality: feature_defs/services.py changed shape; update this script")
        services.write_text(stripped)
        (root / "feature_defs" / "request_features.py").unlink()
    return root


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--quick", action="store_true", help="fewer days and transactions (a few minutes)")
    args = parser.parse_args()
    days, per_day, users = (8, 8_000, 1_000) if args.quick else (11, 20_000, 2_000)
    window = f"{days - 1}d"
    cutoff = START + timedelta(days=days)

    from quiver.catalog.loader import load_catalog
    from quiver.config import load_config
    from quiver.offline.backfill import backfill
    from quiver.pipelines.demo_data import generate
    from quiver.pipelines.training import run_training
    from quiver.registry import Registry

    began = time.perf_counter()
    report: dict[str, Any] = {"days": days, "transactions_per_day": per_day, "users": users, "window": window,
                              "cutoff": cutoff.isoformat(), "seed": 0, "quick": args.quick}
    with tempfile.TemporaryDirectory() as tmp:
        data = Path(tmp) / "data"
        generate(data, days=days, start=START, users=users, transactions_per_day=per_day, seed=7,
                 drift_from_day=days - 1, late_fraction=0.01, malformed_fraction=0.001)
        for variant, with_request in (("without", False), ("with", True)):
            root = project(Path(tmp) / variant, with_request)
            (root / "data").symlink_to(data)
            config = load_config(root / "quiver.yaml")
            catalog = load_catalog(config.catalog_dir, root=root)
            Registry(config.registry, project=config.project).apply(catalog, author="model_quality")
            backfill(config, catalog, START, cutoff)
            result = run_training(config, "fraud_model", window, cutoff.isoformat(), device="cpu", seed=0,
                                  log=lambda _: None)
            report[variant] = {"model": {k: result.metrics[k] for k in KEYS},
                               "baseline": {k: result.baseline[k] for k in KEYS}, "status": result.status,
                               "rows": result.rows, "features": len(result.version.features)}
    report["total_s"] = time.perf_counter() - began
    print(f"{'':>26} {'ROC-AUC':>8} {'PR-AUC':>8} {'log loss':>9} {'Brier':>8}")
    for variant in ("without", "with"):
        for who in ("model", "baseline"):
            m = report[variant][who]
            name = f"{variant} request features, {'network' if who == 'model' else 'baseline'}"
            print(f"{name:>36} {m['roc_auc']:8.4f} {m['pr_auc']:8.4f} {m['log_loss']:9.5f} {m['brier']:8.5f}")
        print(f"{'':>36} status {report[variant]['status']}, {report[variant]['features']} features, "
              f"rows {report[variant]['rows']}")
    RESULTS.mkdir(exist_ok=True)
    (RESULTS / "model_quality.json").write_text(json.dumps(report, indent=2))
    ratio = report["without"]["model"]["log_loss"] / report["with"]["model"]["log_loss"]
    print(f"RESULT model_quality ratio={ratio:.2f} quiver={report['with']['model']['roc_auc']:.4f} "
          f"peer={report['with']['baseline']['roc_auc']:.4f}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
