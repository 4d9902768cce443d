"""Loading libprism.so and declaring its C ABI to ctypes.

Everything here mirrors include/prism/common.h and include/prism/kernels.h (and, when the library
was built with CUDA, include/prism/cuda.h). The struct layouts are pinned on the C side by
lib/abi.c (static assertions with the same offsets and sizes), and checked from Python by
tests/python/test_kernels.py; change the three together.

The library is found, in order:
  1. the environment variable PRISM_LIBRARY, a full path (nothing else is tried when it is set);
  2. the build folders of this checkout: build/lib/libprism.so, then build-release/lib/libprism.so
     (a sanitizer build is never picked: its library only loads under the ASan runtime);
  3. ctypes.util.find_library("prism") (ldconfig, LD_LIBRARY_PATH).
It is loaded on first use, not on `import prism`, so that the rest of the package imports
without it; a failure raises LibraryNotFoundError (an ImportError) that lists where it looked.
"""

import ctypes
import ctypes.util
import enum
import os
import threading

# ---- errors ----------------------------------------------------------------------------------


class Status(enum.IntEnum):
    """prism_status (include/prism/common.h)."""

    OK = 0
    INVALID = 1
    NOMEM = 2
    IO = 3
    LIMIT = 4
    NOT_FOUND = 5
    STATE = 6
    UNAVAILABLE = 7


class PrismError(RuntimeError):
    """A call into libprism failed: `status` (a Status) and the library's `message`."""

    def __init__(self, status, message):
        try:
            status = Status(status)
        except ValueError:
            pass
        self.status = status
        self.message = message
        name = status.name if isinstance(status, Status) else str(status)
        super().__init__(f"{message} [{name}]")

    def __reduce__(self):  # pickles (multiprocessing) with its two arguments
        return (type(self), (self.status, self.message))


class PrismInvalidError(PrismError, ValueError):
    """PRISM_ERR_INVALID: libprism refused an argument (also a ValueError, like the checks that
    the binding makes itself before calling)."""


class LibraryNotFoundError(ImportError):
    """libprism.so could not be found or loaded; the message says where the binding looked."""


def raise_for(status, err):
    """Raises the exception for a non-zero prism_status, with the message from err."""
    if status == Status.OK:
        return
    message = err.message.decode("utf-8", "replace") or f"libprism call failed with status {status}"
    cls = PrismInvalidError if status == Status.INVALID else PrismError
    raise cls(status, message)


# ---- structs (lib/abi.c pins these layouts) ---------------------------------------------------


class Error(ctypes.Structure):
    """prism_error"""

    _fields_ = [("status", ctypes.c_int), ("message", ctypes.c_char * 512)]


class Tensor(ctypes.Structure):
    """prism_tensor: contiguous elements at data (host memory for *_cpu, device for *_cuda)."""

    _fields_ = [("data", ctypes.c_void_p), ("numel", ctypes.c_size_t), ("dtype", ctypes.c_int)]


class QuantSpec(ctypes.Structure):
    """prism_quant_spec"""

    _fields_ = [
        ("format", ctypes.c_int),
        ("granularity", ctypes.c_int),
        ("group", ctypes.c_size_t),
        ("scale_mode", ctypes.c_int),
        ("rounding", ctypes.c_int),
        ("seed", ctypes.c_uint64),
    ]


class QuantCounts(ctypes.Structure):
    """prism_quant_counts"""

    _fields_ = [
        ("saturated", ctypes.c_uint64),
        ("underflowed", ctypes.c_uint64),
        ("nonfinite", ctypes.c_uint64),
        ("bad_scale", ctypes.c_uint64),
    ]


class GradStats(ctypes.Structure):
    """prism_grad_stats"""

    _fields_ = [
        ("l2_norm", ctypes.c_double),
        ("max_abs", ctypes.c_double),
        ("mean", ctypes.c_double),
        ("variance", ctypes.c_double),
        ("numel", ctypes.c_uint64),
        ("nonfinite", ctypes.c_uint64),
    ]


# ---- prototypes ---------------------------------------------------------------------------------

_P = ctypes.POINTER
_vp = ctypes.c_void_p
_sz = ctypes.c_size_t
_st = ctypes.c_int  # prism_status
_errp = _P(Error)
_specp = _P(QuantSpec)
_tp = _P(Tensor)
_gsp = _P(GradStats)

# Every function the binding uses, with (restype, argtypes). Pointers to caller memory are passed
# as c_void_p (an address from numpy's ctypes.data or torch's data_ptr()).
_CPU = {
    "prism_status_name": (ctypes.c_char_p, [_st]),
    "prism_quant_layout": (_st, [_specp, _sz, _P(_sz), _P(_sz), _P(_sz), _errp]),
    "prism_quant_qmax": (ctypes.c_float, [ctypes.c_int]),
    "prism_quantize_cpu": (_st, [_specp, _tp, _vp, _vp, _P(ctypes.c_uint64), _errp]),
    "prism_dequantize_cpu": (_st, [_specp, _vp, _vp, _sz, _vp, ctypes.c_int, _errp]),
    # spec, x, codes, scales, counts, err
    "prism_quantize_counted_cpu": (_st, [_specp, _tp, _vp, _vp, _P(QuantCounts), _errp]),
    # spec, x, scales (given), codes, amax, counts, err
    "prism_quantize_scaled_cpu": (_st, [_specp, _tp, _vp, _vp, _vp, _P(QuantCounts), _errp]),
    "prism_quant_scale_delayed": (ctypes.c_float, [ctypes.c_float, ctypes.c_int, ctypes.c_int]),
    "prism_dequantize_accumulate_cpu": (_st, [_specp, _vp, _vp, _sz, _vp, _errp]),
    "prism_relative_error_cpu": (_st, [_tp, _tp, _P(ctypes.c_double), _errp]),
    "prism_grad_stats_blocks_cpu": (_st, [_tp, _P(_sz), _sz, _gsp, _errp]),
    "prism_f32_to_fp8": (ctypes.c_uint8, [ctypes.c_float, ctypes.c_int]),
    "prism_fp8_to_f32": (ctypes.c_float, [ctypes.c_uint8, ctypes.c_int]),
    "prism_philox4x32_10": (None, [_P(ctypes.c_uint32), _P(ctypes.c_uint32), _P(ctypes.c_uint32)]),
}

# include/prism/cuda.h, present only in a library built with a CUDA toolkit. Every data pointer
# is device memory; the stream is a cudaStream_t (torch's current stream); out-parameters marked
# _device are device memory too.
_CUDA = {
    "prism_cuda_device_count": (_st, [_P(ctypes.c_int), _errp]),
    # spec, x (device data), codes, scales, unsigned long long *nonfinite_device, stream, err
    "prism_quantize_cuda": (_st, [_specp, _tp, _vp, _vp, _vp, _vp, _errp]),
    # spec, x (device data), codes, scales, prism_quant_counts *counts_device, stream, err
    "prism_quantize_counted_cuda": (_st, [_specp, _tp, _vp, _vp, _vp, _vp, _errp]),
    # spec, x, scales (given), codes, amax, counts (all device), stream, err
    "prism_quantize_scaled_cuda": (_st, [_specp, _tp, _vp, _vp, _vp, _vp, _vp, _errp]),
    # spec, codes, scales, numel, out, out_dtype, stream, err
    "prism_dequantize_cuda": (_st, [_specp, _vp, _vp, _sz, _vp, ctypes.c_int, _vp, _errp]),
    # spec, codes, scales, numel, acc, stream, err
    "prism_dequantize_accumulate_cuda": (_st, [_specp, _vp, _vp, _sz, _vp, _vp, _errp]),
    # a, b, double *out_device, stream, err
    "prism_relative_error_cuda": (_st, [_tp, _tp, _vp, _vp, _errp]),
    # tensors (host array, device data), block_start (host), blocks, out_device, stream, err
    "prism_grad_stats_blocks_cuda": (_st, [_tp, _P(_sz), _sz, _vp, _vp, _errp]),
}

CUDA_KERNELS = ("prism_quantize_cuda", "prism_dequantize_cuda", "prism_dequantize_accumulate_cuda",
                "prism_relative_error_cuda", "prism_grad_stats_blocks_cuda")

# ---- loading ------------------------------------------------------------------------------------

_REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
_BUILD_DIRS = ("build", "build-release")


def candidates():
    """Where the library is looked for, in order: [(description, path or None)]."""
    env = os.environ.get("PRISM_LIBRARY")
    if env:
        return [("PRISM_LIBRARY", env)]
    found = [(f"{d}/lib", os.path.join(_REPO, d, "lib", "libprism.so")) for d in _BUILD_DIRS]
    found.append(('ctypes.util.find_library("prism")', ctypes.util.find_library("prism")))
    return found


class Library:
    """The loaded CDLL with its prototypes declared, and what it offers."""

    def __init__(self, path):
        self.path = path
        self.dll = ctypes.CDLL(path)
        for table in (_CPU, _CUDA):
            for name, (restype, argtypes) in table.items():
                fn = getattr(self.dll, name, None)
                if fn is None:
                    if table is _CPU:
                        raise LibraryNotFoundError(
                            f"{path} is not a usable libprism: it lacks {name}")
                    continue
                fn.restype = restype
                fn.argtypes = argtypes
        self.has_cuda = all(hasattr(self.dll, name) for name in CUDA_KERNELS)

    def __getattr__(self, name):
        return getattr(self.dll, name)


_lock = threading.Lock()
_library = None


def load(path=None):
    """The loaded library (loading it the first time); path, when given, is loaded instead of
    searching, and replaces a library already loaded."""
    global _library
    with _lock:
        if path is not None:
            try:
                _library = Library(path)
            except OSError as e:
                raise LibraryNotFoundError(f"cannot load libprism from {path}: {e}") from None
            return _library
        if _library is not None:
            return _library
        tried = []
        for where, cand in candidates():
            if not cand:
                tried.append(f"{where}: not found")
                continue
            if os.sep in cand and not os.path.exists(cand):
                tried.append(f"{where}: {cand} does not exist")
                continue
            try:
                _library = Library(cand)
                return _library
            except OSError as e:
                tried.append(f"{where}: {cand}: {e}")
        raise LibraryNotFoundError(
            "libprism.so not found; build it (cmake --build build --target prism) or set "
            "PRISM_LIBRARY to its full path. Looked at:\n  " + "\n  ".join(tried))
