"""The one error type of the readers and exporters: it names the file and what was wrong."""

from __future__ import annotations

import json
from pathlib import Path


class ScanFileError(ValueError):
    """A file cannot be read (or written) as asked; ``path`` is the file, the message says why."""

    def __init__(self, path, problem: str):
        self.path = Path(path) if path is not None else None
        self.problem = problem
        super().__init__(f"{path}: {problem}")


def read_json_object(path) -> dict:
    """The JSON object in file ``path``; ScanFileError when it is not valid JSON or not an object."""
    path = Path(path)
    try:
        doc = json.loads(path.read_text())
    except ValueError as e:
        raise ScanFileError(path, f"is not valid JSON ({e})") from None
    if not isinstance(doc, dict):
        raise ScanFileError(path, "must hold a JSON object")
    return doc
