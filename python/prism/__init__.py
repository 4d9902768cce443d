"""Prism's Python package (DESIGN.md section 1): a ctypes binding of libprism.so (kernels and the
trainer's client, prism.Client), and prism.torch, the PyTorch integration (imported on its own,
so that this package does not need torch).

NumPy arrays and PyTorch tensors (CPU, and CUDA when libprism has its CUDA kernels) are passed
to the C kernels by pointer. libprism is found through PRISM_LIBRARY, the checkout's build
folders, or the system's library path (see prism._lib), and loaded on the first call.
"""

# prism.v1 (the protobuf messages, generated at build time into build/python-gen) is a separate
# folder on sys.path: let this package span both.
__path__ = __import__("pkgutil").extend_path(__path__, __name__)

from ._lib import LibraryNotFoundError, PrismError, PrismInvalidError, Status  # noqa: E402
from ._lib import load as load_library  # noqa: E402
from .client import Client, fingerprint  # noqa: E402
from .transfer import Transfer  # noqa: E402
from .kernels import (  # noqa: E402
    Format,
    Layout,
    code_bytes,
    dequantize,
    dequantize_accumulate,
    f32_to_fp8,
    fp8_to_f32,
    grad_stats,
    grad_stats_blocks,
    groups,
    has_cuda,
    layout,
    library_path,
    qmax,
    quantize,
    quantize_counted,
    quantize_scaled,
    relative_error,
    scale_delayed,
)

__all__ = [
    "Client", "fingerprint", "Format", "Transfer", "Layout", "LibraryNotFoundError", "PrismError", "PrismInvalidError", "Status",
    "code_bytes", "dequantize", "dequantize_accumulate", "f32_to_fp8", "fp8_to_f32",
    "grad_stats", "grad_stats_blocks", "groups", "has_cuda", "layout", "library_path",
    "load_library", "qmax", "quantize", "quantize_counted", "quantize_scaled", "relative_error",
    "scale_delayed",
]
