"""State kept once per napari viewer (slider keepers, camera refits, the display rule's hook).

Plugin widgets see napari's proxies, a new one on every access, so the real
viewer behind them is the key.  Entries are keyed by its id with a weak
reference: a closed viewer's entry goes with it, and a new viewer that reuses
the id starts afresh instead of inheriting a dead one's hooks.
"""

from __future__ import annotations

import weakref

from .common import unwrap


def viewer_state(registry: dict, viewer, create: bool = True):
    """``(state, new)``: the dict ``registry`` keeps for ``viewer`` and whether it was made by this call.

    ``state["viewer"]`` is a weak reference to the real viewer.  With ``create=False`` a viewer without
    an entry gives ``(None, False)``."""
    real = unwrap(viewer)
    key = id(real)
    state = registry.get(key)
    if state is not None and state["viewer"]() is real:
        return state, False
    if not create:
        return None, False

    def forget(ref, key=key):
        if registry.get(key, {}).get("viewer") is ref:    # not a newer viewer's entry under a reused id
            registry.pop(key, None)

    state = {"viewer": weakref.ref(real, forget)}
    registry[key] = state
    return state, True
