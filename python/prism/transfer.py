"""Block transfer (include/prism/transfer.h, DESIGN 9) from Python.

    t = prism.Transfer("cuda:0", max_block_bytes=2 * numel)    # or "cpu"
    t.add_block(0, host_weights_bf16)                           # kept by the engine (pinned on CUDA)
    ticket = t.fetch(0, "int8", dst_bf16)                       # codes + scales over the bus,
    t.wait_stream(ticket)                                       # dequantized to BF16 on the GPU

Weights are BF16: a torch.bfloat16 tensor in host memory, or a NumPy uint16 array of BF16 bits.
A destination is a contiguous torch.bfloat16 tensor of the block's numel elements: on the engine's
GPU for CUDA, in host memory for the CPU backend. On CUDA a fetch returns before the GPU has done
it; wait_stream (torch's current stream by default) makes later work on that stream wait for it
without the host waiting, wait() waits on the host.
"""

import ctypes

import numpy as np

from . import _lib

PRECISIONS = ("bf16", "int8", "fp8_e4m3", "fp8_e5m2", "int4")
_GRANULARITIES = {"tensor": 0, "row": 1, "block": 2}
_SCALES = {"fp32": 0, "pow2": 1}
# prism_transfer_scale_mode by value: the names of the config key scale_mode (DESIGN 4.7).
SCALE_MODES = ("current", "pow2", "delayed", "static")
VERDICTS = ("allow", "optimizer", "pressure", "window", "slots")


class TransferOptions(ctypes.Structure):
    _fields_ = [("backend", ctypes.c_int), ("device", ctypes.c_int), ("staging_buffers", ctypes.c_uint),
                ("max_block_bytes", ctypes.c_size_t), ("quant", ctypes.POINTER(_lib.QuantSpec)),
                ("conductor", ctypes.c_void_p), ("scale_mode", ctypes.c_int),
                ("amax_history_len", ctypes.c_uint32), ("scale_margin", ctypes.c_int32)]


class Ticket(ctypes.Structure):
    _fields_ = [("seq", ctypes.c_uint64), ("verdict", ctypes.c_int)]


_N = 5
_COUNTERS = [("fetches", ctypes.c_uint64 * _N), ("wire_bytes", ctypes.c_uint64 * _N),
             ("bf16_bytes", ctypes.c_uint64 * _N), ("prefetches", ctypes.c_uint64),
             ("refused", ctypes.c_uint64 * _N), ("demand_waits", ctypes.c_uint64),
             ("demand_over_limit", ctypes.c_uint64), ("prepares", ctypes.c_uint64), ("nonfinite", ctypes.c_uint64),
             ("quantized", ctypes.c_uint64 * _N), ("saturated", ctypes.c_uint64 * _N),
             ("underflowed", ctypes.c_uint64 * _N)]


class TransferCounters(ctypes.Structure):
    _fields_ = _COUNTERS


_P = ctypes.POINTER
_vp = ctypes.c_void_p
_st = ctypes.c_int
_errp = _P(_lib.Error)

PROTOTYPES = {
    "prism_transfer_create": (_st, [_P(TransferOptions), _P(_vp), _errp]),
    "prism_transfer_destroy": (None, [_vp]),
    "prism_transfer_add_block": (_st, [_vp, ctypes.c_uint32, _vp, ctypes.c_size_t, _errp]),
    "prism_transfer_update_block": (_st, [_vp, ctypes.c_uint32, _vp, ctypes.c_size_t, _errp]),
    "prism_transfer_prepare": (_st, [_vp, ctypes.c_uint32, ctypes.c_int, _errp]),
    "prism_transfer_wire_bytes": (_st, [_vp, ctypes.c_uint32, ctypes.c_int, _P(ctypes.c_size_t), _errp]),
    "prism_transfer_fetch": (_st, [_vp, ctypes.c_uint32, ctypes.c_int, _vp, _vp, _P(Ticket), _errp]),
    "prism_transfer_ticket_wait": (_st, [_vp, _P(Ticket), _errp]),
    "prism_transfer_ticket_wait_stream": (_st, [_vp, _P(Ticket), _vp, _errp]),
    "prism_transfer_synchronize": (_st, [_vp, _errp]),
    "prism_transfer_get_counters": (None, [_vp, _P(TransferCounters)]),
    "prism_transfer_set_scale_mode": (_st, [_vp, ctypes.c_int, ctypes.c_uint32, ctypes.c_int32, _errp]),
    "prism_transfer_block_counts": (_st, [_vp, ctypes.c_uint32, ctypes.c_int, _P(_lib.QuantCounts),
                                          _P(ctypes.c_size_t), _errp]),
}


def _dll():
    lib = _lib.load()
    if not getattr(lib, "_transfer_declared", False):
        for name, (restype, argtypes) in PROTOTYPES.items():
            fn = getattr(lib.dll, name)
            fn.restype = restype
            fn.argtypes = argtypes
        lib._transfer_declared = True
    return lib.dll


def _invalid(message):
    return _lib.PrismInvalidError(_lib.Status.INVALID, message)


def _precision(name):
    if name not in PRECISIONS:
        raise _invalid(f"precision: {name!r} is not one of {', '.join(PRECISIONS)}")
    return PRECISIONS.index(name)


def _weights(w, name):
    """(pointer, numel, keep-alive) of BF16 weights in host memory."""
    if isinstance(w, np.ndarray):
        if w.dtype != np.uint16:
            raise _invalid(f"{name}: a NumPy array of BF16 bits must be uint16, not {w.dtype}")
        w = np.ascontiguousarray(w)
        return w.ctypes.data, w.size, w
    import torch
    if not isinstance(w, torch.Tensor) or w.dtype != torch.bfloat16 or w.is_cuda:
        raise _invalid(f"{name}: BF16 weights in host memory (a torch.bfloat16 CPU tensor or uint16 array)")
    w = w.contiguous()
    return w.data_ptr(), w.numel(), w


def _destination(dst):
    """(pointer, numel, "cpu" or "cuda") of a fetch's destination."""
    iface = getattr(dst, "__cuda_array_interface__", None)
    import torch
    if isinstance(dst, torch.Tensor):
        if dst.dtype != torch.bfloat16 or not dst.is_contiguous():
            raise _invalid("dst: a contiguous torch.bfloat16 tensor")
        return dst.data_ptr(), dst.numel(), "cuda" if dst.is_cuda else "cpu"
    if iface is None:
        raise _invalid("dst: a contiguous torch.bfloat16 tensor, or a device array with __cuda_array_interface__")
    shape, typestr = tuple(iface.get("shape", ())), iface.get("typestr", "")
    if len(shape) != 1 or typestr not in ("<u2", "<i2", "<V2", "|V2"):
        raise _invalid(f"dst: a one-dimensional array of 2-byte BF16 bits, not shape {shape} of {typestr!r}")
    if iface.get("strides") not in (None, (2,)):
        raise _invalid(f"dst: contiguous, not strides {iface['strides']}")
    return int(iface["data"][0]), int(shape[0]), "cuda"


def _scale_options(scale_mode, amax_history_len, scale_margin):
    """(mode value, history length, margin) checked for type; the ranges are the C library's."""
    if scale_mode not in SCALE_MODES:
        raise _invalid(f"scale_mode: {scale_mode!r} is not one of {', '.join(SCALE_MODES)}")
    for name, v in (("amax_history_len", amax_history_len), ("scale_margin", scale_margin)):
        if isinstance(v, bool) or not isinstance(v, int):
            raise _invalid(f"{name}: {v!r} is not an integer")
    if not 0 <= amax_history_len <= 1024:
        raise _invalid(f"amax_history_len: {amax_history_len} is outside 1 to 1024 (0: 16)")
    if not -32 <= scale_margin <= 32:
        raise _invalid(f"scale_margin: {scale_margin} is outside -32 to 32")
    return SCALE_MODES.index(scale_mode), amax_history_len, scale_margin


def _stream(stream):
    """A cudaStream_t for the C calls: None (the legacy default stream), an int, or .cuda_stream."""
    if stream is None:
        return None
    if isinstance(stream, int):
        return stream or None
    return stream.cuda_stream or None


class Transfer:
    """A transfer engine: "cpu", or a CUDA device ("cuda", "cuda:1", a torch.device).

    scale_mode (the job's config key, include/prism/transfer.h): "current" (the scales of the
    block's current amax, as `scale` says), "pow2", "delayed" (max of the amax of the block's
    last amax_history_len prepared weight versions, times 2**scale_margin) or "static" (the
    scales of the weights as registered by add_block, kept); set_scale_mode changes it mid-run.
    block_counts() gives what the last prepare clipped."""

    def __init__(self, device, max_block_bytes, staging_buffers=0, granularity="block", block=128, scale="fp32",
                 scale_mode="current", amax_history_len=0, scale_margin=0):
        dev = str(device)
        if dev == "cpu":
            backend, index = 0, 0
        elif dev == "cuda" or dev.startswith("cuda:"):
            backend, index = 1, int(dev.split(":")[1]) if ":" in dev else 0
        else:
            raise _invalid(f"device: {dev!r} is not cpu or cuda[:N]")
        if granularity not in _GRANULARITIES:
            raise _invalid(f"granularity: {granularity!r} is not one of tensor, row, block")
        if scale not in _SCALES:
            raise _invalid(f"scale: {scale!r} is not one of fp32, pow2")
        mode, hist, margin = _scale_options(scale_mode, amax_history_len, scale_margin)
        self.device = dev
        self._spec = _lib.QuantSpec(format=1, granularity=_GRANULARITIES[granularity], group=int(block),
                                    scale_mode=_SCALES[scale], rounding=0, seed=0)
        opts = TransferOptions(backend, index, int(staging_buffers), int(max_block_bytes), ctypes.pointer(self._spec),
                               None, mode, hist, margin)
        self._dll = _dll()
        handle = _vp()
        err = _lib.Error()
        _lib.raise_for(self._dll.prism_transfer_create(ctypes.byref(opts), ctypes.byref(handle), ctypes.byref(err)),
                       err)
        self._t = handle
        self.numel = {}
        self.scale_mode = scale_mode

    def close(self):
        if self._t:
            self._dll.prism_transfer_destroy(self._t)
            self._t = None

    def __del__(self):
        try:
            self.close()
        except Exception:  # interpreter shutdown
            pass

    def _call(self, name, *args):
        if not self._t:
            raise _lib.PrismError(_lib.Status.STATE, "the transfer engine is closed")
        err = _lib.Error()
        _lib.raise_for(getattr(self._dll, name)(self._t, *args, ctypes.byref(err)), err)

    def add_block(self, block_id, weights):
        ptr, n, _keep = _weights(weights, "weights")
        self._call("prism_transfer_add_block", int(block_id), ptr, n)
        self.numel[int(block_id)] = n

    def update_block(self, block_id, weights):
        ptr, n, _keep = _weights(weights, "weights")
        self._call("prism_transfer_update_block", int(block_id), ptr, n)

    def prepare(self, block_id, precision):
        self._call("prism_transfer_prepare", int(block_id), _precision(precision))

    def wire_bytes(self, block_id, precision):
        out = ctypes.c_size_t()
        self._call("prism_transfer_wire_bytes", int(block_id), _precision(precision), ctypes.byref(out))
        return out.value

    def fetch(self, block_id, precision, dst, stream=None):
        """Block block_id in precision into dst, its numel BF16 elements: a contiguous
        torch.bfloat16 tensor (on the GPU for CUDA, in host memory for the CPU), or for CUDA any
        device array with __cuda_array_interface__ (CuPy, Numba, ...) of 2-byte elements holding
        BF16 bits (typestr <u2, <i2 or <V2), one-dimensional and contiguous. stream: a
        torch.cuda.Stream, or any object with .cuda_stream, or a cudaStream_t as an int, whose
        queued work the fetch comes after (default: none). Returns a Ticket."""
        ptr, count, where = _destination(dst)
        if where != ("cpu" if self.device == "cpu" else "cuda"):
            raise _invalid(f"dst: in {where} memory, but the engine is {self.device}")
        n = self.numel.get(int(block_id))
        if n is not None and count != n:
            raise _invalid(f"dst: {count} elements, block {block_id} has {n}")
        ticket = Ticket()
        self._call("prism_transfer_fetch", int(block_id), _precision(precision), ptr, _stream(stream),
                   ctypes.byref(ticket))
        return ticket

    def wait(self, ticket):
        """Waits on the host until the fetch is done."""
        self._call("prism_transfer_ticket_wait", ctypes.byref(ticket))

    def wait_stream(self, ticket, stream=None):
        """Makes later work on stream wait for the fetch: as fetch takes it; default torch's
        current stream (the legacy default stream where torch has no CUDA)."""
        if stream is None:
            import torch
            stream = torch.cuda.current_stream() if torch.cuda.is_available() else 0
        self._call("prism_transfer_ticket_wait_stream", ctypes.byref(ticket), _stream(stream))

    def set_scale_mode(self, scale_mode, amax_history_len=0, scale_margin=0):
        """A new scale mode (the job's config changed): every image is made again at its next
        use, amax histories start afresh (static scales stay the registered weights'), the blocks'
        last counts are cleared. The mode in force with the same figures changes nothing."""
        mode, hist, margin = _scale_options(scale_mode, amax_history_len, scale_margin)
        self._call("prism_transfer_set_scale_mode", mode, hist, margin)
        self.scale_mode = scale_mode

    def block_counts(self, block_id, precision):
        """What the last prepare of the block's image in precision (not bf16) clipped:
        {"saturated", "underflowed", "nonfinite", "numel"} (numel: the elements it quantized, 0
        when the image has not been made since add_block or set_scale_mode)."""
        c = _lib.QuantCounts()
        n = ctypes.c_size_t()
        self._call("prism_transfer_block_counts", int(block_id), _precision(precision), ctypes.byref(c),
                   ctypes.byref(n))
        return {"saturated": int(c.saturated), "underflowed": int(c.underflowed), "nonfinite": int(c.nonfinite),
                "numel": int(n.value)}

    def synchronize(self):
        self._call("prism_transfer_synchronize")

    def counters(self):
        c = TransferCounters()
        self._dll.prism_transfer_get_counters(self._t, ctypes.byref(c))
        out = {}
        for name, kind in _COUNTERS:
            v = getattr(c, name)
            if name == "refused":
                out[name] = {VERDICTS[i]: int(v[i]) for i in range(1, _N)}
            elif hasattr(v, "__len__"):
                out[name] = {PRECISIONS[i]: int(v[i]) for i in range(_N)}
            else:
                out[name] = int(v)
        return out
