"""CBPE against NannyML itself (issue 54), on the synthetic car-loan dataset NannyML ships.

NannyML 0.13.1 runs in its own venv (tests/integration/nannyml_env.py): it fits CBPE on the labelled reference
half and estimates ROC-AUC and the confusion-matrix metrics on the analysis half in chunks of 5,000 rows, and
writes its estimates, its realized values and the rows it judged. Quiver estimates the same chunks.

NannyML decides the reference's scores need calibration (ECE 0.016, far beyond chance on 50,000 rows) and maps
them with an isotonic regression fitted on the reference. Quiver's check agrees: by default it refuses them
("uncalibrated": estimated from the raw scores, ROC-AUC would be off by up to 0.017 and F1 by 0.035), and with
`recalibrate=True` it fits the same isotonic map (accepted on cross-fitted rows), so both estimate from the
same probabilities. Left: NannyML rounds its expected counts to 5
decimals and does not group tied scores (on a straight segment of the curve that changes nothing), so the
estimates agree to far better than the 0.005 asked. NannyML's band is ±3 sampling errors from reference
chunks; Quiver's is a simulated 95 % prediction interval: they are compared only loosely (same scale).
"""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest

from quiver.monitoring import performance_estimation as pe
from tests.integration.nannyml_env import run_nannyml_script

pytestmark = [pytest.mark.integration, pytest.mark.slow]

CHUNK = 5_000
THRESHOLD = 0.65  # the car-loan model's decision threshold (its y_pred is y_pred_proba ≥ 0.65)
COMPARED = ("roc_auc", "precision", "recall", "f1", "accuracy")
_SCRIPT = """
import json, sys
import numpy as np
import nannyml as nml

reference, analysis, targets = nml.load_synthetic_car_loan_dataset()
analysis = analysis.merge(targets, on="id")
metrics = ["roc_auc", "precision", "recall", "f1", "accuracy"]
cbpe = nml.CBPE(y_pred_proba="y_pred_proba", y_pred="y_pred", y_true="repaid", timestamp_column_name="timestamp",
                metrics=metrics, chunk_size=int(sys.argv[1]), problem_type="classification_binary")
cbpe.fit(reference)
table = cbpe.estimate(analysis).filter(period="analysis").to_df()
chunks = [{"start": int(row[("chunk", "start_index")]), "end": int(row[("chunk", "end_index")]),
           **{m: {k: float(row[(m, k)]) for k in ("value", "realized", "lower_confidence_boundary",
                                                   "upper_confidence_boundary")} for m in metrics}}
          for _, row in table.iterrows()]
json.dump({"needs_calibration": bool(cbpe.needs_calibration), "chunks": chunks,
           "reference": {"score": reference["y_pred_proba"].tolist(), "label": reference["repaid"].tolist()},
           "analysis": {"score": analysis["y_pred_proba"].tolist(), "label": analysis["repaid"].tolist(),
                        "y_pred": analysis["y_pred"].tolist()}}, open("nannyml_cbpe.json", "w"))
"""


@pytest.fixture(scope="module")
def nannyml_run(tmp_path_factory: pytest.TempPathFactory) -> dict:  # type: ignore[type-arg]
    folder = tmp_path_factory.mktemp("nannyml")
    script = folder / "nannyml_cbpe.py"
    script.write_text(_SCRIPT)
    run_nannyml_script(script, str(CHUNK))
    return json.loads(Path(folder / "nannyml_cbpe.json").read_text())  # type: ignore[no-any-return]


def test_quiver_cbpe_equals_nannyml_on_the_car_loan_dataset(nannyml_run: dict) -> None:  # type: ignore[type-arg]
    reference_scores = np.asarray(nannyml_run["reference"]["score"])
    reference_labels = np.asarray(nannyml_run["reference"]["label"])
    scores = np.asarray(nannyml_run["analysis"]["score"])
    labels = np.asarray(nannyml_run["analysis"]["label"])
    # The dataset's model decides "repaid" at score ≥ 0.65: Quiver is given that threshold
    assert np.array_equal(np.asarray(nannyml_run["analysis"]["y_pred"]), (scores >= THRESHOLD).astype(int))

    assert nannyml_run["needs_calibration"] is True
    refused = pe.check_calibration(reference_scores, reference_labels, threshold=THRESHOLD)
    assert not refused.calibrated and refused.reason.startswith("scores are not calibrated: ECE 0.016")
    assert pe.estimate_performance(scores[:CHUNK], refused).status == "uncalibrated"
    ours = pe.check_calibration(reference_scores, reference_labels, threshold=THRESHOLD, recalibrate=True,
                                source="car-loan reference")
    assert ours.calibrated and ours.calibrator is not None, ours.reason
    assert "recalibrated" in ours.reason
    assert len(nannyml_run["chunks"]) == len(scores) // CHUNK
    for chunk in nannyml_run["chunks"]:
        rows = slice(chunk["start"], chunk["end"] + 1)
        estimate = pe.estimate_performance(scores[rows], ours, draws=200)
        realized = pe.realized_metrics(scores[rows], labels[rows], THRESHOLD)
        assert estimate.status == "estimated"
        for metric in COMPARED:
            theirs, mine = chunk[metric], estimate.metrics[metric]
            assert mine.estimate == pytest.approx(theirs["value"], abs=0.005 if metric == "roc_auc" else 1e-4), \
                (metric, chunk["start"])
            assert realized[metric] == pytest.approx(theirs["realized"], abs=1e-9), (metric, chunk["start"])
            # bands of the same scale: ours (95 %) inside theirs (±3 sampling errors, ~99.7 %) widened by half
            width = theirs["upper_confidence_boundary"] - theirs["lower_confidence_boundary"]
            assert 0.2 * width < mine.upper - mine.lower < 1.5 * width, (metric, chunk["start"])
        assert abs(estimate.metrics["roc_auc"].estimate - chunk["roc_auc"]["value"]) < 1e-3


def test_quiver_bands_hold_the_realized_values_of_the_car_loan_chunks(nannyml_run: dict) -> None:  # type: ignore[type-arg]
    """The 95 % bands, on the recalibrated car-loan scores, hold the realized value of most chunk × metric."""
    check = pe.check_calibration(np.asarray(nannyml_run["reference"]["score"]),
                                 np.asarray(nannyml_run["reference"]["label"]), threshold=THRESHOLD,
                                 recalibrate=True)
    scores, labels = np.asarray(nannyml_run["analysis"]["score"]), np.asarray(nannyml_run["analysis"]["label"])
    inside = []
    for start in range(0, len(scores), CHUNK):
        rows = slice(start, start + CHUNK)
        estimate = pe.estimate_performance(scores[rows], check, draws=200, seed=start)
        realized = pe.realized_metrics(scores[rows], labels[rows], THRESHOLD)
        inside += [estimate.metrics[m].lower <= realized[m] <= estimate.metrics[m].upper for m in pe.METRICS]
    assert np.mean(inside) >= 0.8, f"{sum(inside)} of {len(inside)} inside"
