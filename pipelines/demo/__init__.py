"""The demo, apart from the product: `run` is `make demo` (the main job end to end on synthetic data) and
`loop` the simulated weeks of the retraining loop it tells. Nothing in `quiver` imports this package; it uses
the product the way a user does (the SDK, the commands, the DAGs), so it sits above the command line
(`tests/unit/test_house_layers.py`).

    python -m quiver.pipelines.demo [--days N]
"""
