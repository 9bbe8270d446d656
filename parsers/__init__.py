"""Parsers: files in, canonical frames out (see forensics/frames.py). Nothing here detects anything."""
