from __future__ import annotations

import json
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
SHARED = ROOT.parent / "shared"
SAMPLE_DATA = SHARED / "sample_data"
SCHEMA_PATH = ROOT / "forensics" / "schema" / "findings.schema.json"


def shared_path(*parts: str) -> Path:
    """A file under ../shared/sample_data; the test is skipped when the shared folder is absent."""
    path = SAMPLE_DATA.joinpath(*parts)
    if not path.exists():
        pytest.skip(f"shared sample data not available: {path}")
    return path


@pytest.fixture(scope="session")
def findings_validator():
    import jsonschema

    schema = json.loads(SCHEMA_PATH.read_text())
    return jsonschema.Draft202012Validator(schema)


def assert_valid_findings(validator, path_or_doc) -> dict:
    doc = json.loads(Path(path_or_doc).read_text()) if not isinstance(path_or_doc, dict) else path_or_doc
    errors = sorted(validator.iter_errors(doc), key=lambda e: list(e.path))
    assert not errors, "\n".join(f"{list(e.path)}: {e.message}" for e in errors[:10])
    return doc
