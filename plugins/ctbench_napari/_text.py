"""Message text helpers shared by the Qt widgets and the Qt-free reader/writer."""

from __future__ import annotations


def unquote(text: str) -> str:
    """Drop the quotes KeyError puts around its message, never the closing quote of "got 'abc'"."""
    if len(text) >= 2 and text[0] == text[-1] and text[0] in "'\"":
        return text[1:-1]
    return text
