"""An in-memory block store backed by one torch tensor."""

from __future__ import annotations

import torch

from .base import check_value, normalize_window


class TensorStore:
    """A tensor seen as a block store (for tests, small problems, and as the in-memory peer of ZarrStore).

    ``read`` returns a copy (the caller owns it); ``write`` copies into the tensor.
    """

    def __init__(self, tensor: torch.Tensor, chunks=None):
        if not isinstance(tensor, torch.Tensor):
            raise TypeError(f"tensor must be a torch.Tensor, got {type(tensor).__name__}")
        self.tensor = tensor.detach()
        shape = tuple(self.tensor.shape)
        if chunks is None:
            chunks = shape
        chunks = tuple(int(c) for c in chunks)
        if len(chunks) != len(shape) or any(c <= 0 for c in chunks):
            raise ValueError(f"chunks must be {len(shape)} positive integers, got {chunks!r}")
        self._chunks = tuple(min(c, max(n, 1)) for c, n in zip(chunks, shape))
        self._record = None
        self.allow_incomplete = False

    @classmethod
    def empty(cls, shape, dtype=torch.float32, chunks=None, device="cpu") -> "TensorStore":
        """A zero-filled store of ``shape``."""
        return cls(torch.zeros(tuple(shape), dtype=dtype, device=device), chunks)

    @property
    def shape(self) -> tuple[int, ...]:
        return tuple(self.tensor.shape)

    @property
    def dtype(self) -> torch.dtype:
        return self.tensor.dtype

    @property
    def chunks(self) -> tuple[int, ...]:
        return self._chunks

    def staging_bytes(self, window_shape, write: bool = False) -> int:
        """Reads and writes copy straight between the tensor and the caller's: no staging."""
        return 0

    # ---------------------------------------------------- completion records
    def location(self):
        """The tensor's storage (two stores over the same memory share it)."""
        st = self.tensor.untyped_storage()
        return ("memory", self.tensor.device.type, st.data_ptr())

    def completion_record(self):
        return self._record

    def set_completion_record(self, record) -> None:
        self._record = record

    def read(self, window=None) -> torch.Tensor:
        w = normalize_window(window, self.shape)
        if not self.allow_incomplete and self._record is not None:
            from .completion import check_window_complete
            check_window_complete(self, self._record, w[0].start, w[0].stop, "the tensor store")
        return self.tensor[w].clone()

    def write(self, window, value: torch.Tensor) -> None:
        w = normalize_window(window, self.shape)
        self.tensor[w].copy_(check_value(value, w, self.dtype))

    def __repr__(self) -> str:
        return f"TensorStore(shape={self.shape}, dtype={self.dtype}, chunks={self.chunks})"
