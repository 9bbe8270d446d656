"""Parsers: files in, canonical frames out (see forensics/base/frames.py). Nothing here detects anything."""
