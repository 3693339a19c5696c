"""Serving: SDK entry point and HTTP feature server."""
