"""The widgets' shared building blocks, by kind (one module each); this module names them all in one place for
scripts, tests and benchmarks written against ``common``.

- :mod:`.messages`: the message line, ``report_errors``, ``error_text``
- :mod:`.forms`: spin boxes, rows, ``ParamForm``, ``ProgressBar``, ``rows_height``
- :mod:`.layer_tools`: ``LayerPicker``, proxies (``unwrap``, ``same_layer``, ``qt_window``), ``add_or_update``,
  ``set_placement``, ``fit_view``
- :mod:`.layout`: ``scroll_contents``, ``is_deleted``
- :mod:`.workers`: ``start_worker`` and the workers' priority, pool and spawner
- :mod:`.steps`: ``Steps`` (one GUI step per event-loop turn)
"""

from __future__ import annotations

from .forms import ParamForm, ProgressBar, double_spin, int_spin, row_of, rows_height  # noqa: F401
from .layer_tools import (LayerPicker, add_or_update, fit_view, qt_window, same_layer, set_placement,  # noqa: F401
                          unwrap)
from .layout import is_deleted, scroll_contents  # noqa: F401
from .messages import MessageLabel, error_text, log, report_errors  # noqa: F401
from .steps import Steps, after_this_turn, next_turn, steps_pending  # noqa: F401
from .workers import (BACKGROUND_NICE, SPAWNER, WorkerRuntimeError, _at_background_priority,  # noqa: F401
                      background_priority, keep_a_pool_thread_free, live_workers, spawner_ready, start_worker,
                      stop_all_workers)
