"""Base types and units every layer shares (errors, frames, findings, settings, normalisers, catalogs) and the
utilities parsers and fleet triage both use (process pool, Ray engine, atomic outputs). Imports nothing above it."""
