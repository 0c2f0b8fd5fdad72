"""Messages where the user looks: a status line beside the controls that caused it, errors also as a napari
notification, readable one-line texts for exceptions."""

from __future__ import annotations

import functools
import logging
from typing import Callable

from qtpy.QtCore import Qt
from qtpy.QtWidgets import QLabel

from .._text import unquote

log = logging.getLogger("ctbench_napari")


class MessageLabel(QLabel):
    """A one-paragraph status line: errors in red, notes in the normal colour."""

    def __init__(self, parent=None):
        super().__init__(parent)
        self.setWordWrap(True)
        self.setTextInteractionFlags(Qt.TextSelectableByMouse)
        self.level = ""
        self.hide()

    def error(self, text: str) -> None:
        self.level = "error"
        self.setStyleSheet("color: #ff6b6b;")
        self.setText(text)
        self.show()

    def note(self, text: str) -> None:
        self.level = "note"
        self.setStyleSheet("")
        self.setText(text)
        self.show()

    def clear(self) -> None:
        self.level = ""
        self.setText("")
        self.hide()


def report_errors(method: Callable) -> Callable:
    """Show any exception of a widget action in its ``message`` label instead of a traceback."""

    @functools.wraps(method)
    def wrapper(self, *args, **kwargs):
        try:
            return method(self, *args, **kwargs)
        except Exception as e:  # noqa: BLE001 - the point is to catch everything a user can trigger
            log.debug("ctbench widget action failed", exc_info=True)
            self.message.error(error_text(e))
            return None

    return wrapper


def error_text(e: BaseException) -> str:
    """A readable one-liner for an exception (no traceback, no class name for plain value errors)."""
    text = str(e) or type(e).__name__
    if isinstance(e, (ValueError, TypeError, FileNotFoundError, FileExistsError, KeyError)):
        return unquote(text)
    return f"{type(e).__name__}: {text}"
