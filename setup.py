"""The optional compiled Flight Recorder reader (parsers/fr_columns.c); everything else is in pyproject.toml.

``optional=True``: without a C compiler or Python's headers the build carries on without it and the pure-Python
reader reads every dump (docs/performance.md, "Flight Recorder dumps").
"""

from setuptools import Extension, setup

setup(ext_modules=[Extension("forensics.parsers.fr_columns", ["parsers/fr_columns.c"], optional=True)])
