"""The optional compiled readers (parsers/fr_columns.c: Flight Recorder dumps; parsers/kineto_columns.c: Kineto
traces); everything else is in pyproject.toml.

``optional=True``: without a C compiler or Python's headers the build carries on without them and the Python
readers read every file (docs/performance.md, "Flight Recorder dumps", "Ninth pass").
"""

from setuptools import Extension, setup

setup(ext_modules=[
    Extension("forensics.parsers.fr_columns", ["parsers/fr_columns.c"], optional=True),
    Extension("forensics.parsers.kineto_columns", ["parsers/kineto_columns.c"], optional=True),
])
