"""The libprism client (include/prism/client.h) from Python: the trainer's side of the
conversation with its prism-agent.

    c = prism.Client(job_id="llama-7b-run3", rank=0, world_size=4, dir="/run/prism")
    c.register("llama-7b@main", blocks=[("layers.0", [(4096, 4096), (4096,)]), ...])
    for step in ...:
        c.begin_step(step)                  # the map in effect at this step (no system call after)
        c.precision(3)                      # "int8", "bf16", ...
        ...
        c.report_step(step, [[grads of block 0], [grads of block 1], ...], loss=2.9)

Hybrid devices (DESIGN 11): register's blocks may be dicts carrying the planner's cost figures
(flops, activation_bytes_bf16, state_bytes); stage_tensor_stats([...]) adds weight and
activation statistics to the next report; compute_precision(b) / compute_precisions() / plan()
read the compute plan that came with the map in use. A libprism built before those calls loads
all the same: has_plans() is False, stage_tensor_stats raises PrismError (UNAVAILABLE), and the
getters answer "no plan".

Like the C client, nothing here ever blocks the training step or raises because the agent is
missing: a report that cannot go out is dropped and counted (`counters()`); report_* return
False then. Bad arguments raise PrismInvalidError (a ValueError).
"""

import ctypes
import math
import numbers

from . import _lib
from .kernels import block_tensors

PRECISIONS = ("bf16", "int8", "fp8_e4m3", "fp8_e5m2", "int4")
_GRANULARITIES = {"tensor": 0, "row": 1, "block": 2}

FINGERPRINT_BYTES = 32


class ClientOptions(ctypes.Structure):
    _fields_ = [("dir", ctypes.c_char_p), ("socket_name", ctypes.c_char_p), ("hints_name", ctypes.c_char_p),
                ("job_id", ctypes.c_char_p), ("rank", ctypes.c_uint32), ("world_size", ctypes.c_uint32),
                ("reconnect_interval_ms", ctypes.c_uint32)]


class QuantConfig(ctypes.Structure):
    _fields_ = [("format", ctypes.c_int), ("granularity", ctypes.c_int), ("block_size", ctypes.c_uint32)]


class BlockLayout(ctypes.Structure):
    _fields_ = [("name", ctypes.c_char_p), ("param_bytes_bf16", ctypes.c_uint64),
                ("shape", ctypes.POINTER(ctypes.c_uint64)), ("shape_len", ctypes.c_size_t),
                ("flops", ctypes.c_uint64), ("activation_bytes_bf16", ctypes.c_uint64),
                ("state_bytes", ctypes.c_uint64)]


class ModelLayout(ctypes.Structure):
    _fields_ = [("model_id", ctypes.c_char_p), ("quant", QuantConfig), ("blocks", ctypes.POINTER(BlockLayout)),
                ("n_blocks", ctypes.c_uint32)]


class RuntimeHints(ctypes.Structure):
    _fields_ = [("map_version", ctypes.c_uint64), ("max_inflight_h2d", ctypes.c_uint32),
                ("max_inflight_d2h", ctypes.c_uint32), ("prefetch_window", ctypes.c_uint32),
                ("suppress_prefetch_in_backward", ctypes.c_bool), ("suppress_prefetch_in_optimizer", ctypes.c_bool),
                ("vram_pressure_threshold", ctypes.c_double)]


class ClientState(ctypes.Structure):
    _fields_ = [("map_version", ctypes.c_uint64), ("decided_step", ctypes.c_uint64),
                ("effective_step", ctypes.c_uint64), ("map_blocks", ctypes.c_uint32),
                ("registered", ctypes.c_bool), ("connected", ctypes.c_bool), ("hints_mapped", ctypes.c_bool),
                ("upstream_connected", ctypes.c_bool), ("calibration_needed", ctypes.c_bool),
                ("run_calibration", ctypes.c_bool), ("calibration_samples", ctypes.c_uint32),
                ("low_precision", ctypes.c_int), ("hints", RuntimeHints),
                # the numerics config (issue 17)
                ("scale_mode", ctypes.c_uint32), ("amax_history_len", ctypes.c_uint32),
                ("scale_margin", ctypes.c_int32), ("low_auto", ctypes.c_bool), ("n_low_formats", ctypes.c_uint32),
                ("low_formats", ctypes.c_int * 4), ("n_calibration_formats", ctypes.c_uint32),
                ("calibration_formats", ctypes.c_int * 4)]


# prism.v1.ScaleMode by value: the names of the config key scale_mode.
SCALE_MODES = ("current", "pow2", "delayed", "static")
# quant.format of a layout registered with low_precision "auto" (PRISM_QUANT_FORMAT_AUTO).
_QUANT_FORMAT_AUTO = 255


class BlockFractions(ctypes.Structure):
    """prism_block_fractions: a block's saturated and underflowed fractions of a step."""

    _fields_ = [("saturated", ctypes.c_double), ("underflowed", ctypes.c_double)]


_COUNTER_NAMES = ("reports_sent", "reports_dropped", "calibrations_sent", "calibrations_dropped", "hellos_sent",
                  "bytes_sent", "send_errors", "connects", "reconnects", "connect_failures", "disconnects",
                  "hint_reads", "hint_read_failures", "hint_open_failures", "hint_remaps", "invalid_calls",
                  "late_switches", "tensor_stats_sent", "plans_applied")


class ClientCounters(ctypes.Structure):
    _fields_ = [(name, ctypes.c_uint64) for name in _COUNTER_NAMES]


class BlockTensorStats(ctypes.Structure):
    """prism_block_tensor_stats: one block's weight and input-activation figures (DESIGN 11)."""

    _fields_ = [("block_id", ctypes.c_uint32), ("reserved", ctypes.c_uint32), ("x_l2", ctypes.c_double),
                ("x_max_abs", ctypes.c_double), ("x_numel", ctypes.c_uint64), ("w_l2", ctypes.c_double),
                ("w_max_abs", ctypes.c_double), ("w_numel", ctypes.c_uint64), ("y_numel", ctypes.c_uint64)]


DEVICE_CLASS_MAX = 128


class ClientPlan(ctypes.Structure):
    """prism_client_plan: the compute plan that came with the map in use."""

    _fields_ = [("has_plan", ctypes.c_bool), ("high_fp16", ctypes.c_bool), ("low_format", ctypes.c_int),
                ("map_version", ctypes.c_uint64), ("low_blocks", ctypes.c_uint32),
                ("predicted_iteration_seconds", ctypes.c_double), ("compute_seconds", ctypes.c_double),
                ("device_class", ctypes.c_char * DEVICE_CLASS_MAX)]


_P = ctypes.POINTER
_vp = ctypes.c_void_p
_errp = _P(_lib.Error)
_st = ctypes.c_int

PROTOTYPES = {
    "prism_client_open": (_st, [_P(ClientOptions), _P(_vp), _errp]),
    "prism_client_close": (None, [_vp]),
    "prism_model_fingerprint": (_st, [_P(ModelLayout), _P(ctypes.c_uint8), _errp]),
    "prism_client_register": (_st, [_vp, _P(ModelLayout), _errp]),
    "prism_client_fingerprint": (_st, [_vp, _P(ctypes.c_uint8), _errp]),
    "prism_client_report_step": (_st, [_vp, ctypes.c_uint64, _P(ctypes.c_double), _P(ctypes.c_uint32),
                                       _P(_lib.GradStats), ctypes.c_size_t, _errp]),
    "prism_client_report_step_cpu": (_st, [_vp, ctypes.c_uint64, _P(ctypes.c_double), _P(_lib.Tensor),
                                           _P(ctypes.c_size_t), _P(ctypes.c_uint32), ctypes.c_size_t, _errp]),
    "prism_client_report_step_ex": (_st, [_vp, ctypes.c_uint64, _P(ctypes.c_double), _P(ctypes.c_uint32),
                                          _P(_lib.GradStats), _P(BlockFractions), ctypes.c_size_t, _errp]),
    "prism_client_report_step_cpu_ex": (_st, [_vp, ctypes.c_uint64, _P(ctypes.c_double), _P(_lib.Tensor),
                                              _P(ctypes.c_size_t), _P(ctypes.c_uint32), _P(BlockFractions),
                                              ctypes.c_size_t, _errp]),
    "prism_client_report_calibration": (_st, [_vp, ctypes.c_int, ctypes.c_uint32, _P(ctypes.c_uint32),
                                              _P(ctypes.c_double), ctypes.c_size_t, _errp]),
    "prism_client_begin_step": (ctypes.c_uint64, [_vp, ctypes.c_uint64]),
    "prism_client_block_precision": (ctypes.c_int, [_vp, ctypes.c_uint32]),
    "prism_client_map_version": (ctypes.c_uint64, [_vp]),
    "prism_client_get_state": (_st, [_vp, _P(ClientState), _errp]),
    "prism_client_get_counters": (_st, [_vp, _P(ClientCounters), _errp]),
    "prism_client_last_error": (ctypes.c_char_p, [_vp]),
}

# The hybrid plans' part of the client (issue 15): a library built before it lacks them, and the
# binding then says so (has_plans() False) instead of failing to load.
PLAN_PROTOTYPES = {
    "prism_client_stage_tensor_stats": (_st, [_vp, _P(BlockTensorStats), ctypes.c_size_t, _errp]),
    "prism_client_compute_precision": (ctypes.c_int, [_vp, ctypes.c_uint32]),
    "prism_client_get_plan": (_st, [_vp, _P(ClientPlan), _errp]),
}


# include/prism/cuda.h, in a library built with CUDA: the stream is a cudaStream_t.
CUDA_PROTOTYPES = {
    "prism_client_report_step_cuda": (_st, [_vp, ctypes.c_uint64, _P(ctypes.c_double), _P(_lib.Tensor),
                                            _P(ctypes.c_size_t), _P(ctypes.c_uint32), ctypes.c_size_t, _vp, _errp]),
    "prism_client_report_step_cuda_ex": (_st, [_vp, ctypes.c_uint64, _P(ctypes.c_double), _P(_lib.Tensor),
                                               _P(ctypes.c_size_t), _P(ctypes.c_uint32), _P(BlockFractions),
                                               ctypes.c_size_t, _vp, _errp]),
}


def _dll():
    lib = _lib.load()
    if not getattr(lib, "_client_declared", False):
        for name, (restype, argtypes) in PROTOTYPES.items():
            fn = getattr(lib.dll, name)
            fn.restype = restype
            fn.argtypes = argtypes
        for name, (restype, argtypes) in (*CUDA_PROTOTYPES.items(), *PLAN_PROTOTYPES.items()):
            fn = getattr(lib.dll, name, None)
            if fn is not None:
                fn.restype = restype
                fn.argtypes = argtypes
        lib._client_declared = True
    return lib.dll


def has_plans():
    """Whether the loaded libprism has the compute-plan calls (prism_client_stage_tensor_stats,
    prism_client_compute_precision, prism_client_get_plan)."""
    dll = _dll()
    return all(getattr(dll, name, None) is not None for name in PLAN_PROTOTYPES)


def _plan_fn(dll, name):
    fn = getattr(dll, name, None)
    if fn is None:
        raise _lib.PrismError(_lib.Status.UNAVAILABLE, f"{_lib.load().path} has no {name}: it was built before "
                              "the compute plans (issue 15)")
    return fn


def _fractions(fractions, n):
    """fractions as report_step takes them (None, or n entries of a (saturated, underflowed) pair or
    None) as a C array of prism_block_fractions, NaN pairs for None; None for None. The range
    is the library's to check (it names the block)."""
    if fractions is None:
        return None
    fractions = list(fractions)
    if len(fractions) != n:
        raise _lib.PrismInvalidError(_lib.Status.INVALID, f"fractions: {len(fractions)} entries for {n} blocks")
    arr = (BlockFractions * max(n, 1))()
    for i, f in enumerate(fractions):
        if f is None:
            arr[i] = BlockFractions(math.nan, math.nan)
        else:
            sat, und = f
            arr[i] = BlockFractions(float(sat), float(und))
    return arr


def _precision_value(name, param):
    if name not in PRECISIONS:
        raise _lib.PrismInvalidError(_lib.Status.INVALID, f"{param}: {name!r} is not one of {', '.join(PRECISIONS)}")
    return PRECISIONS.index(name)


def _shape_words(shapes):
    words = []
    for s in shapes:
        s = tuple(int(d) for d in s)
        words.append(len(s))
        words.extend(s)
    return words


class _Layout:
    """The C layout and the Python objects its pointers point into (kept alive together)."""

    def __init__(self, model_id, blocks, low_precision, granularity, block_size):
        if granularity not in _GRANULARITIES:
            raise _lib.PrismInvalidError(_lib.Status.INVALID,
                                         f"granularity: {granularity!r} is not one of tensor, row, block")
        self.names = []
        self.shapes = []
        n = len(blocks)
        self.array = (BlockLayout * max(n, 1))()
        for i, b in enumerate(blocks):
            name, shapes, nbytes, costs = _block_fields(i, b)
            encoded = name.encode("utf-8")
            words = _shape_words(shapes)
            arr = (ctypes.c_uint64 * max(len(words), 1))(*words)
            self.names.append(encoded)
            self.shapes.append(arr)
            self.array[i] = BlockLayout(encoded, nbytes, arr, len(words), *costs)
        self.model_id = model_id.encode("utf-8")
        fmt = _QUANT_FORMAT_AUTO if low_precision == "auto" else _precision_value(low_precision, "low_precision")
        quant = QuantConfig(fmt, _GRANULARITIES[granularity],
                            int(block_size))
        self.layout = ModelLayout(self.model_id, quant, self.array, n)


_TENSOR_STATS_KEYS = ("block_id", "x_l2", "x_max_abs", "x_numel", "w_l2", "w_max_abs", "w_numel", "y_numel")
_BLOCK_KEYS = ("name", "shapes", "param_bytes_bf16", "flops", "activation_bytes_bf16", "state_bytes")
_COST_KEYS = ("flops", "activation_bytes_bf16", "state_bytes")


def _u64(value, param):
    """value as a C uint64_t, or PrismInvalidError naming param (ctypes would wrap a negative one)."""
    if isinstance(value, bool) or not isinstance(value, numbers.Integral) or not 0 <= int(value) < 1 << 64:
        raise _lib.PrismInvalidError(_lib.Status.INVALID, f"{param}: {value!r} is not an integer in [0, 2^64)")
    return int(value)


def _block_fields(i, b):
    """(name, shapes, param_bytes_bf16, (flops, activation_bytes_bf16, state_bytes)) of one block
    given as (name, shapes), (name, shapes, param_bytes_bf16) or a dict with the keys of
    _BLOCK_KEYS (name and shapes required; param_bytes_bf16 defaults to 2 bytes per element of
    the shapes, the cost figures to 0, unknown)."""
    if isinstance(b, dict):
        unknown = sorted(set(b) - set(_BLOCK_KEYS))
        if unknown:
            raise _lib.PrismInvalidError(_lib.Status.INVALID, f"blocks[{i}]: unknown key {unknown[0]!r} "
                                         f"(known: {', '.join(_BLOCK_KEYS)})")
        for key in ("name", "shapes"):
            if key not in b:
                raise _lib.PrismInvalidError(_lib.Status.INVALID, f"blocks[{i}]: {key!r} is missing")
        name, shapes, nbytes = b["name"], b["shapes"], b.get("param_bytes_bf16")
        costs = tuple(_u64(b.get(k, 0), f"blocks[{i}].{k}") for k in _COST_KEYS)
    else:
        name, shapes = b[0], b[1]
        nbytes = b[2] if len(b) > 2 else None
        costs = (0, 0, 0)
    if nbytes is None:
        nbytes = 2 * sum(_numel(s) for s in shapes)
    return name, shapes, _u64(nbytes, f"blocks[{i}].param_bytes_bf16"), costs


def _numel(shape):
    n = 1
    for d in shape:
        n *= int(d)
    return n


def fingerprint(model_id, blocks, low_precision="int8", granularity="block", block_size=128):
    """The layout's fingerprint (DESIGN 4.5, the encoding in include/prism/client.h) as 32 bytes.
    blocks: [(name, [shape, ...]) or (name, [shape, ...], param_bytes_bf16) or a dict, as for
    Client.register] (the cost figures are not part of it)."""
    lay = _Layout(model_id, blocks, low_precision, granularity, block_size)
    out = (ctypes.c_uint8 * FINGERPRINT_BYTES)()
    err = _lib.Error()
    _lib.raise_for(_dll().prism_model_fingerprint(ctypes.byref(lay.layout), out, ctypes.byref(err)), err)
    return bytes(out)


class Client:
    """One trainer's connection to its agent (include/prism/client.h). Use from one thread."""

    def __init__(self, job_id=None, rank=0, world_size=1, dir=None, reconnect_interval_ms=0):
        dll = _dll()
        opts = ClientOptions(dir.encode() if dir else None, None, None, job_id.encode() if job_id else None,
                             int(rank), int(world_size), int(reconnect_interval_ms))
        handle = _vp()
        err = _lib.Error()
        _lib.raise_for(dll.prism_client_open(ctypes.byref(opts), ctypes.byref(handle), ctypes.byref(err)), err)
        self._c = handle
        self._dll = dll
        self._layout = None
        self._n_blocks = 0

    def close(self):
        if self._c:
            self._dll.prism_client_close(self._c)
            self._c = None

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.close()

    def __del__(self):
        try:
            self.close()
        except Exception:  # interpreter shutdown: the library may already be gone
            pass

    def _handle(self):
        if not self._c:
            raise _lib.PrismError(_lib.Status.STATE, "the client is closed")
        return self._c

    def register(self, model_id, blocks, low_precision="int8", granularity="block", block_size=128):
        """Registers the model; blocks in id order, each (name, [shape, ...]), (name, shapes,
        param_bytes_bf16) or a dict {"name", "shapes", "param_bytes_bf16"?, "flops"?,
        "activation_bytes_bf16"?, "state_bytes"?} (the hybrid planner's cost figures, DESIGN 11:
        forward FLOPs per step, activations kept for backward in BF16 bytes, bytes no precision
        changes; absent: 0, unknown; param_bytes_bf16 absent: 2 bytes per element of the shapes).
        Returns the fingerprint (32 bytes)."""
        lay = _Layout(model_id, blocks, low_precision, granularity, block_size)
        err = _lib.Error()
        _lib.raise_for(self._dll.prism_client_register(self._handle(), ctypes.byref(lay.layout), ctypes.byref(err)),
                       err)
        self._layout = lay
        self._n_blocks = len(blocks)
        return self.fingerprint()

    def fingerprint(self):
        out = (ctypes.c_uint8 * FINGERPRINT_BYTES)()
        err = _lib.Error()
        _lib.raise_for(self._dll.prism_client_fingerprint(self._handle(), out, ctypes.byref(err)), err)
        return bytes(out)

    def begin_step(self, step):
        """Takes the map in effect at `step`; returns its version (0: none yet, all bf16)."""
        return int(self._dll.prism_client_begin_step(self._handle(), int(step)))

    def precision(self, block):
        """The block's precision name in the map taken by the last begin_step."""
        return PRECISIONS[self._dll.prism_client_block_precision(self._handle(), int(block))]

    def precisions(self):
        """Every registered block's precision, in id order."""
        h = self._handle()
        return [PRECISIONS[self._dll.prism_client_block_precision(h, b)] for b in range(self._n_blocks)]

    def map_version(self):
        return int(self._dll.prism_client_map_version(self._handle()))

    def _sent(self, status, err):
        if status == _lib.Status.UNAVAILABLE:
            return False
        _lib.raise_for(status, err)
        return True

    def report_stats(self, step, stats, loss=None, block_ids=None, fractions=None):
        """Sends statistics already computed: stats is a list of dicts (l2_norm, max_abs, mean,
        variance, numel, nonfinite), block_ids their ids (default 0..n-1), fractions as
        report_step's. False: dropped."""
        n = len(stats)
        frac = _fractions(fractions, n)
        ids = list(range(n)) if block_ids is None else [int(b) for b in block_ids]
        arr = (_lib.GradStats * max(n, 1))()
        for i, s in enumerate(stats):
            arr[i] = _lib.GradStats(float(s["l2_norm"]), float(s["max_abs"]), float(s["mean"]),
                                    float(s["variance"]), int(s["numel"]), int(s["nonfinite"]))
        id_arr = (ctypes.c_uint32 * max(n, 1))(*ids)
        loss_p = ctypes.byref(ctypes.c_double(float(loss))) if loss is not None else None
        err = _lib.Error()
        if frac is None:
            st = self._dll.prism_client_report_step(self._handle(), int(step), loss_p, id_arr, arr, n,
                                                    ctypes.byref(err))
        else:
            st = self._dll.prism_client_report_step_ex(self._handle(), int(step), loss_p, id_arr, arr, frac, n,
                                                       ctypes.byref(err))
        return self._sent(st, err)

    def report_step(self, step, blocks, loss=None, block_ids=None, fractions=None):
        """Computes each block's gradient statistics with Prism's kernels where the gradients are
        and sends them. blocks: a list, one per block, of lists of arrays or tensors, all in host
        memory or all on one CUDA device. Host memory: computed now, then sent; False means
        dropped. CUDA: queued on torch's current stream and sent by a later call of this client
        once the GPU got there (prism_client_report_step_cuda); False means dropped.
        fractions (issue 17): None, or one entry per block: a (saturated, underflowed) pair of
        fractions in [0, 1] of the block's elements that the step's quantization clipped and
        flushed to zero, or None for a block not measured (the report then carries neither);
        with CUDA gradients they are copied at the call and go out with the queued report."""
        n = len(blocks)
        frac = _fractions(fractions, n)
        device, tensors, block_start = block_tensors(blocks)
        id_arr = None if block_ids is None else (ctypes.c_uint32 * max(n, 1))(*[int(b) for b in block_ids])
        loss_p = ctypes.byref(ctypes.c_double(float(loss))) if loss is not None else None
        err = _lib.Error()
        if device is None and frac is not None:
            st = self._dll.prism_client_report_step_cpu_ex(self._handle(), int(step), loss_p, tensors, block_start,
                                                           id_arr, frac, n, ctypes.byref(err))
            return self._sent(st, err)
        if device is None:
            st = self._dll.prism_client_report_step_cpu(self._handle(), int(step), loss_p, tensors, block_start,
                                                        id_arr, n, ctypes.byref(err))
            return self._sent(st, err)
        fn = getattr(self._dll, "prism_client_report_step_cuda" if frac is None else "prism_client_report_step_cuda_ex",
                     None)
        if fn is None:
            raise _lib.PrismError(_lib.Status.UNAVAILABLE, f"{_lib.load().path} was built without CUDA")
        import torch
        with torch.cuda.device(device):
            stream = torch.cuda.current_stream().cuda_stream
            if frac is None:
                st = fn(self._handle(), int(step), loss_p, tensors, block_start, id_arr, n, stream, ctypes.byref(err))
            else:
                st = fn(self._handle(), int(step), loss_p, tensors, block_start, id_arr, frac, n, stream,
                        ctypes.byref(err))
        return self._sent(st, err)

    def report_calibration(self, fmt, samples, errors):
        """errors: {block_id: relative_error} measured in fmt over `samples` passes. False: dropped."""
        ids = sorted(errors)
        id_arr = (ctypes.c_uint32 * max(len(ids), 1))(*ids)
        val = (ctypes.c_double * max(len(ids), 1))(*[float(errors[b]) for b in ids])
        err = _lib.Error()
        st = self._dll.prism_client_report_calibration(self._handle(), _precision_value(fmt, "format"), int(samples),
                                                       id_arr, val, len(ids), ctypes.byref(err))
        return self._sent(st, err)

    def stage_tensor_stats(self, stats):
        """Stages weight and input-activation statistics (prism_client_stage_tensor_stats) to go
        out with the next report written whole, replacing what was staged; [] clears. stats: a
        list of dicts with "block_id" and any of "x_l2", "x_max_abs", "x_numel", "w_l2",
        "w_max_abs", "w_numel", "y_numel" (absent: 0; x_numel 0 means no activation figures,
        w_numel 0 no weight figures). PrismInvalidError names the entry at fault; PrismError
        UNAVAILABLE when the library predates the call."""
        n = len(stats)
        arr = (BlockTensorStats * max(n, 1))()
        for i, e in enumerate(stats):
            unknown = sorted(set(e) - set(_TENSOR_STATS_KEYS))
            if unknown:
                raise _lib.PrismInvalidError(_lib.Status.INVALID, f"stats[{i}]: unknown key {unknown[0]!r} "
                                             f"(known: {', '.join(_TENSOR_STATS_KEYS)})")
            if "block_id" not in e:
                raise _lib.PrismInvalidError(_lib.Status.INVALID, f"stats[{i}]: 'block_id' is missing")
            block = e["block_id"]
            if isinstance(block, bool) or not isinstance(block, numbers.Integral) or not 0 <= block < 1 << 32:
                raise _lib.PrismInvalidError(_lib.Status.INVALID, f"stats[{i}].block_id: {block!r} is not a block id")
            figures = {}
            for k in _TENSOR_STATS_KEYS[1:]:
                v = e.get(k, 0)
                figures[k] = _u64(v, f"stats[{i}].{k}") if k.endswith("_numel") else float(v)
            arr[i] = BlockTensorStats(block_id=int(block), **figures)
        fn = _plan_fn(self._dll, "prism_client_stage_tensor_stats")
        err = _lib.Error()
        _lib.raise_for(fn(self._handle(), arr, n, ctypes.byref(err)), err)

    def has_plans(self):
        """Whether the loaded libprism has the compute-plan calls (see prism.client.has_plans)."""
        return has_plans()

    def compute_precision(self, block):
        """The format block `block`'s matrix multiplies run in under the compute plan of the map in
        use (prism_client_compute_precision): "bf16" means the class's high format (bf16 or fp16,
        plan() says), else the plan's low format ("int8" or "fp8_e4m3"). "bf16" without a plan,
        and with a library that predates compute plans."""
        fn = getattr(self._dll, "prism_client_compute_precision", None)
        if fn is None:
            self._handle()
            return "bf16"
        return PRECISIONS[fn(self._handle(), int(block))]

    def compute_precisions(self):
        """compute_precision of every registered block, in id order."""
        fn = getattr(self._dll, "prism_client_compute_precision", None)
        h = self._handle()
        if fn is None:
            return ["bf16"] * self._n_blocks
        return [PRECISIONS[fn(h, b)] for b in range(self._n_blocks)]

    def plan(self):
        """The compute plan that came with the map in use, as of the last begin_step, as a dict
        (map_version, device_class, high_format "bf16" or "fp16", low_format, low_blocks: how many
        blocks are planned low, predicted_iteration_seconds, compute_seconds), or None without
        one (every block runs high; also with a library that predates compute plans)."""
        fn = getattr(self._dll, "prism_client_get_plan", None)
        h = self._handle()
        if fn is None:
            return None
        p = ClientPlan()
        err = _lib.Error()
        _lib.raise_for(fn(h, ctypes.byref(p), ctypes.byref(err)), err)
        if not p.has_plan:
            return None
        return {"map_version": int(p.map_version), "device_class": p.device_class.decode("utf-8", "replace"),
                "high_format": "fp16" if p.high_fp16 else "bf16",
                "low_format": PRECISIONS[p.low_format] if 0 <= p.low_format < len(PRECISIONS) else str(p.low_format),
                "low_blocks": int(p.low_blocks), "predicted_iteration_seconds": p.predicted_iteration_seconds,
                "compute_seconds": p.compute_seconds}

    def state(self):
        """What the client knows as of the last begin_step, as a dict. The numerics config (issue
        17) under the config keys' names: "scale_mode" ("current", "pow2", "delayed", "static"),
        "amax_history_len", "scale_margin", "low_precision" ("auto" under auto), "low_formats"
        (most saving first) and "calibration_formats" (those prismd still wants calibrated; empty
        unless calibration_needed)."""
        s = ClientState()
        err = _lib.Error()
        _lib.raise_for(self._dll.prism_client_get_state(self._handle(), ctypes.byref(s), ctypes.byref(err)), err)
        h = s.hints
        names = lambda arr, n: [PRECISIONS[arr[i]] for i in range(min(n, 4)) if 0 < arr[i] < len(PRECISIONS)]  # noqa: E731
        low = PRECISIONS[s.low_precision] if 0 <= s.low_precision < len(PRECISIONS) else "int8"
        return {
            "map_version": s.map_version, "decided_step": s.decided_step, "effective_step": s.effective_step,
            "map_blocks": s.map_blocks, "registered": s.registered, "connected": s.connected,
            "hints_mapped": s.hints_mapped, "upstream_connected": s.upstream_connected,
            "calibration_needed": s.calibration_needed, "run_calibration": s.run_calibration,
            "calibration_samples": s.calibration_samples,
            "low_precision": "auto" if s.low_auto else low,
            "low_formats": names(s.low_formats, s.n_low_formats),
            "calibration_formats": names(s.calibration_formats, s.n_calibration_formats),
            "scale_mode": SCALE_MODES[s.scale_mode] if s.scale_mode < len(SCALE_MODES) else str(s.scale_mode),
            "amax_history_len": s.amax_history_len, "scale_margin": s.scale_margin,
            "hints": {"map_version": h.map_version, "max_inflight_h2d": h.max_inflight_h2d,
                      "max_inflight_d2h": h.max_inflight_d2h, "prefetch_window": h.prefetch_window,
                      "suppress_prefetch_in_backward": h.suppress_prefetch_in_backward,
                      "suppress_prefetch_in_optimizer": h.suppress_prefetch_in_optimizer,
                      "vram_pressure_threshold": h.vram_pressure_threshold},
        }

    def counters(self):
        c = ClientCounters()
        err = _lib.Error()
        _lib.raise_for(self._dll.prism_client_get_counters(self._handle(), ctypes.byref(c), ctypes.byref(err)), err)
        return {name: int(getattr(c, name)) for name in _COUNTER_NAMES}

    def last_error(self):
        msg = self._dll.prism_client_last_error(self._handle())
        return msg.decode("utf-8", "replace") if msg else ""
