"""`quiver ui`: a read-only web console over the registry, the online store and the reports.

Server-rendered HTML (FastAPI), inline SVG charts, one small stylesheet inlined in every page: no script,
no font or CDN, so it works offline. Pages: home, catalog, one per model, decision and rollout, drift and
quality — each linking the others, so "why is this version serving, and on what evidence?" is two clicks
from the home page (home → model → the decision that moved its alias).
"""
