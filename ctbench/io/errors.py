"""The one error type of the readers and exporters: it names the file and what was wrong."""

from __future__ import annotations

from pathlib import Path


class ScanFileError(ValueError):
    """A file cannot be read (or written) as asked; ``path`` is the file, the message says why."""

    def __init__(self, path, problem: str):
        self.path = Path(path) if path is not None else None
        self.problem = problem
        super().__init__(f"{path}: {problem}")
