"""Panels that fit the screen: scrolling contents, and whether a widget's Qt side is gone."""

from __future__ import annotations

from qtpy.QtCore import Qt
from qtpy.QtWidgets import QWidget


def is_deleted(widget) -> bool:
    """Whether the Qt side of ``widget`` is gone (a worker may finish after its widget was closed)."""
    try:
        widget.objectName()
        return False
    except RuntimeError:
        return True


def scroll_contents(widget) -> None:
    """Put everything ``widget`` laid out into a vertical scroll area, so a tall panel never sets the
    window's minimum height (the window fits a 1080-pixel screen and scrolls on a 768-pixel laptop).

    The widget's own layout object is kept (moved onto the scrolled page), so code that added rows to it
    keeps working.
    """
    from qtpy.QtWidgets import QFrame, QScrollArea, QVBoxLayout

    page = QWidget()
    page.setLayout(widget.layout())      # Qt moves a widget's layout (and its children) onto the page
    wrap_long_rows(page)
    area = QScrollArea()
    area.setWidgetResizable(True)
    area.setFrameShape(QFrame.NoFrame)
    area.setHorizontalScrollBarPolicy(Qt.ScrollBarAlwaysOff)
    area.setWidget(page)
    # As wide as the page wants (no horizontal scrolling), as short as the window needs.
    area.setMinimumWidth(page.minimumSizeHint().width() + area.verticalScrollBar().sizeHint().width())
    outer = QVBoxLayout(widget)
    outer.setContentsMargins(0, 0, 0, 0)
    outer.addWidget(area)
    widget.scroll_area = area


def wrap_long_rows(page) -> None:
    """Every form under ``page`` puts a row's label above its field when both do not fit side by side, so a
    long label ("Range / start (no angles in file)") never sets the panel's width: the docks stay narrow
    enough to leave the canvas most of a 1366-pixel screen."""
    from qtpy.QtWidgets import QFormLayout

    for form in page.findChildren(QFormLayout):
        form.setRowWrapPolicy(QFormLayout.WrapLongRows)
    if isinstance(page.layout(), QFormLayout):
        page.layout().setRowWrapPolicy(QFormLayout.WrapLongRows)
