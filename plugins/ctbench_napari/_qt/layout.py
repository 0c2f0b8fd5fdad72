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
