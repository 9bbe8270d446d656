"""Renderers: pure functions from an Analysis to bytes or text. No analysis happens here."""
