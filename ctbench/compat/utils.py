"""diffct's ``diffct.utils`` public class: :class:`TorchCUDABridge`."""

from __future__ import annotations

import torch

__all__ = ["TorchCUDABridge"]


class TorchCUDABridge:
    """diffct's view of a CUDA tensor as a CUDA array (no copy).  ctbench shares tensors with its
    CuPy kernels through ``__cuda_array_interface__`` itself; this returns such a view (a CuPy
    array when CuPy is installed, else Numba's) for code that asks for one."""

    @staticmethod
    def tensor_to_cuda_array(tensor):
        if not isinstance(tensor, torch.Tensor):
            raise TypeError(f"tensor must be a torch.Tensor, got {type(tensor).__name__}")
        if not tensor.is_cuda:
            raise ValueError("Tensor must be on CUDA device")
        t = tensor.detach()
        try:
            import cupy
        except ImportError:
            cupy = None
        if cupy is not None:
            return cupy.asarray(t)
        from numba import cuda  # diffct's own choice

        return cuda.as_cuda_array(t)
