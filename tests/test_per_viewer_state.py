"""The per-viewer registry behind the slider keepers, camera refits and the display rule's hook
(plugins/ctbench_napari/_qt/per_viewer.py): one entry per real viewer, found again through proxies,
gone with the viewer, and never taken over by a dead viewer whose id is reused."""

import gc

from ctbench_napari._qt.per_viewer import viewer_state


class Viewer:
    pass


class Proxy:
    """napari's public proxy: a new object each time, the real viewer as ``__wrapped__``."""

    def __init__(self, real):
        self.__wrapped__ = real


def test_one_entry_per_real_viewer_through_proxies():
    reg: dict = {}
    v = Viewer()
    state, new = viewer_state(reg, Proxy(v))
    assert new and state["viewer"]() is v
    state["hooked"] = 1
    again, new2 = viewer_state(reg, Proxy(v))
    assert not new2 and again is state and again["hooked"] == 1
    assert viewer_state(reg, v) == (state, False)
    w = Viewer()
    other, new3 = viewer_state(reg, w)
    assert new3 and other is not state and len(reg) == 2


def test_lookup_without_create():
    reg: dict = {}
    v = Viewer()
    assert viewer_state(reg, v, create=False) == (None, False)
    assert reg == {}
    state, _ = viewer_state(reg, v)
    assert viewer_state(reg, v, create=False) == (state, False)


def test_entry_goes_with_its_viewer():
    reg: dict = {}
    v = Viewer()
    viewer_state(reg, v)
    del v
    gc.collect()
    assert reg == {}


def test_stale_entry_is_replaced_and_a_late_callback_spares_the_new_one():
    reg: dict = {}
    v, x = Viewer(), Viewer()
    viewer_state(reg, x)
    # x's entry under v's id, as after an id reuse: v must get an entry of its own, not x's hooks
    reg[id(v)] = reg[id(x)]
    state, new = viewer_state(reg, v)
    assert new and state["viewer"]() is v and reg[id(v)] is state
    # v's entry under x's id: x's death callback must not remove an entry that is not x's
    reg[id(x)] = state
    del x
    gc.collect()
    assert reg[id(v)] is state and state in reg.values() and len(reg) == 2
