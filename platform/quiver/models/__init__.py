"""Models: the tabular network, its artifact format and scorer, and the sliding-window training loop.

Scoring (`quiver.models.artifact.load_model`) imports only torch, numpy and the light core; training
(`quiver.models.train`, `quiver.models.data`, `quiver.models.metrics`) may use more (scikit-learn).
"""
