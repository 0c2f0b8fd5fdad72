"""Messages where the user looks: a status line beside the controls that caused it, errors also as a napari
notification, readable one-line texts for exceptions.

A widget's message line sits under the buttons of its step.  When it changes, the panel's scroll area
scrolls it into view (a message below the fold is a message nobody reads).  An error stays until the user
dismisses it (the x beside it) or starts another action of that widget; no background refresh clears it.
Errors also go to napari's notifications (a toast, then the list under the bell), in the same words.
"""

from __future__ import annotations

import functools
import logging
import re
from typing import Callable

from qtpy.QtCore import Qt, QTimer
from qtpy.QtWidgets import QHBoxLayout, QLabel, QScrollArea, QSizePolicy, QToolButton, QWidget

from .._text import unquote

log = logging.getLogger("ctbench_napari")

ERROR_STYLE = "color: #ff6b6b;"


class MessageLabel(QWidget):
    """A one-paragraph status line: errors in red with a dismiss button (and a napari notification), notes in
    the normal colour.  ``text()``, ``level`` ("error", "note" or "") and ``label`` (the QLabel) for tests."""

    def __init__(self, parent=None, *, notify: bool = True):
        super().__init__(parent)
        self.label = QLabel()
        self.label.setWordWrap(True)
        self.label.setTextInteractionFlags(Qt.TextSelectableByMouse)
        self.label.setSizePolicy(QSizePolicy.Expanding, QSizePolicy.Preferred)
        self.dismiss = QToolButton()
        self.dismiss.setText("×")
        self.dismiss.setToolTip("dismiss this message")
        self.dismiss.setAutoRaise(True)
        self.dismiss.clicked.connect(self.clear)
        lay = QHBoxLayout(self)
        lay.setContentsMargins(0, 0, 0, 0)
        lay.addWidget(self.label, 1)
        lay.addWidget(self.dismiss, 0, Qt.AlignTop)
        self.notify = notify
        self.level = ""
        self.n_notified = 0
        self.hide()

    def text(self) -> str:
        return self.label.text()

    def error(self, text: str) -> None:
        self._show("error", text)
        if self.notify:
            notify_error(text)
            self.n_notified += 1

    def note(self, text: str) -> None:
        self._show("note", text)

    def clear(self) -> None:
        self.level = ""
        self.label.setText("")
        self.hide()

    def _show(self, level: str, text: str) -> None:
        self.level = level
        self.label.setStyleSheet(ERROR_STYLE if level == "error" else "")
        self.label.setText(text)
        self.dismiss.setVisible(level == "error")
        self.show()
        QTimer.singleShot(0, self._scroll_into_view)      # after the layout has placed the grown line

    def _scroll_into_view(self) -> None:
        try:
            scroll_into_view(self)
        except RuntimeError:      # deleted meanwhile (the panel was closed)
            pass


def scroll_into_view(widget) -> None:
    """Scroll every scroll area around ``widget`` so that the widget is in view."""
    w = widget.parentWidget()
    while w is not None:
        if isinstance(w, QScrollArea) and w.widget() is not None and w.widget().isAncestorOf(widget):
            w.ensureWidgetVisible(widget, 0, 8)
        w = w.parentWidget()


def notify_error(text: str) -> None:
    """The error as a napari notification (no traceback: the text is the message)."""
    try:
        from napari.utils.notifications import Notification, NotificationSeverity, notification_manager

        notification_manager.dispatch(Notification(text, severity=NotificationSeverity.ERROR))
    except Exception:  # noqa: BLE001 - a notification that cannot be shown must not hide the message line
        log.debug("could not post a napari notification", exc_info=True)


def report_errors(method: Callable) -> Callable:
    """Show any exception of a widget action in its ``message`` line instead of a traceback."""

    @functools.wraps(method)
    def wrapper(self, *args, **kwargs):
        try:
            return method(self, *args, **kwargs)
        except Exception as e:  # noqa: BLE001 - the point is to catch everything a user can trigger
            log.debug("ctbench widget action failed", exc_info=True)
            self.message.error(error_text(e))
            return None

    return wrapper


# What the library says to a command-line user, said to a GUI user.
GUI_WORDING = (
    (re.compile(r"pass --token-file or set CTBENCH_BRIDGE_TOKEN_FILE"),
     "fill in the Token file field with the bridge's token file"),
    (re.compile(r"pass --url, set CTBENCH_BRIDGE_URL, or start one with 'ctbench bridge serve'"),
     "press Start local bridge, or fill in the Bridge URL field"),
    (re.compile(r"pass overwrite=True \(--overwrite\)"), "tick Overwrite"),
)
_URL = re.compile(r"\s*For further information visit \S+")


def gui_wording(text: str) -> str:
    for pattern, words in GUI_WORDING:
        text = pattern.sub(words, text)
    return _URL.sub("", text).strip()


def _validation_text(e: BaseException) -> str | None:
    """pydantic's ValidationError in plain words: ``field: what is wrong`` per error, no documentation URL."""
    errors = getattr(e, "errors", None)
    if type(e).__name__ != "ValidationError" or not callable(errors):
        return None
    try:
        items = errors()
    except Exception:  # noqa: BLE001 - not pydantic's after all
        return None
    parts = []
    for err in items:
        where = ".".join(str(x) for x in err.get("loc", ()) if x != "__root__")
        msg = re.sub(r"^(Value|Assertion) error, ", "", str(err.get("msg", "")))
        parts.append(f"{where}: {msg}" if where else msg)
    return gui_wording("; ".join(parts)) if parts else None


def error_text(e: BaseException) -> str:
    """A readable one-liner for an exception (no traceback, no class name for plain value errors, no library
    URLs, GUI wording instead of command-line options)."""
    plain = _validation_text(e)
    if plain is not None:
        return plain
    text = gui_wording(str(e) or type(e).__name__)
    if isinstance(e, (ValueError, TypeError, FileNotFoundError, FileExistsError, KeyError, PermissionError)):
        return unquote(text)
    name = type(e).__name__
    if name == "BridgeNotFound":
        return text
    return f"{name}: {text}"
