"""Prism's kernels (include/prism/kernels.h) on NumPy arrays and PyTorch tensors.

Data is passed to libprism by pointer (numpy: ``arr.ctypes.data``, torch: ``t.data_ptr()``):
nothing is copied when an input is already C-contiguous and of a dtype the kernels take.

Where the data lives
    Host: NumPy arrays and CPU torch tensors (they may be mixed in one call); the *_cpu
    kernels run, on the caller's thread and the library's worker threads, without the GIL.
    CUDA: torch tensors on one CUDA device (all the array arguments of a call on the same
    one); the *_cuda kernels of include/prism/cuda.h are launched on
    ``torch.cuda.current_stream()`` of that device, so they are ordered with the caller's torch
    work. Only a library built with a CUDA toolkit has them; otherwise a CUDA tensor raises
    PrismError with status UNAVAILABLE.

Inputs that are only read (x, codes, scales, a, b, the grad_stats tensors)
    NumPy arrays and CPU tensors that are not C-contiguous (or NumPy arrays in non-native byte
    order) are copied to a contiguous array first. A non-contiguous CUDA tensor raises
    ValueError (call ``.contiguous()`` yourself: a hidden copy of a large device tensor is a
    cost the caller should see).
Outputs written in place (``out=``, ``acc``) must be C-contiguous and writeable, else
ValueError: a copy would leave the caller's array unchanged.

Errors
    TypeError: an argument is not a NumPy array or torch tensor where one is needed.
    ValueError: a bad name, number, dtype, size or layout, with the parameter's name and the
    accepted values. PrismInvalidError (a PrismError and a ValueError): the C library refused
    an argument; its message (e.g. "group: 10 elements are not a whole number of rows of 3")
    is the exception's. PrismError (a RuntimeError): any other failure of the library, with
    .status and .message.
"""

import collections
import ctypes
import enum
import numbers
import sys

import numpy as np

from . import _lib
from ._lib import PrismError, Status


class Format(enum.IntEnum):
    """Quantized formats, with the values of prism_precision (BF16 is not one: refused)."""

    BF16 = 0
    INT8 = 1
    FP8_E4M3 = 2
    FP8_E5M2 = 3
    INT4 = 4


FORMATS = {"int8": Format.INT8, "fp8_e4m3": Format.FP8_E4M3, "fp8_e5m2": Format.FP8_E5M2,
           "int4": Format.INT4}
GRANULARITIES = {"tensor": 0, "row": 1, "block": 2}
SCALES = {"fp32": 0, "pow2": 1}
ROUNDINGS = {"nearest": 0, "stochastic": 1}
# prism_dtype
_F32, _BF16, _F16 = 0, 1, 2
DTYPES = {"float32": _F32, "bfloat16": _BF16, "float16": _F16}

Layout = collections.namedtuple("Layout", ["groups", "group_len", "code_bytes"])
Layout.__doc__ = """prism_quant_layout: `groups` scales, `group_len` elements per group (the last
group may be shorter with granularity "block"), `code_bytes` bytes of codes."""

# ---- arguments -----------------------------------------------------------------------------------


def _torch():
    """The torch module when the caller has imported it (a torch tensor implies it has)."""
    return sys.modules.get("torch")


def _is_tensor(x):
    torch = _torch()
    return torch is not None and isinstance(x, torch.Tensor)


def _names(table):
    return ", ".join(repr(k) for k in table)


def _choice(param, value, table):
    if isinstance(value, str) and value in table:
        return table[value]
    raise ValueError(f"{param}: {value!r} is not one of {_names(table)}")


def _format(fmt):
    if isinstance(fmt, Format):
        if fmt == Format.BF16:
            raise ValueError(f"fmt: Format.BF16 is not a quantized format ({_names(FORMATS)})")
        return fmt
    if isinstance(fmt, str) and fmt in FORMATS:
        return FORMATS[fmt]
    raise ValueError(f"fmt: {fmt!r} is not one of {_names(FORMATS)} (or a prism.Format member)")


def _integer(param, value, low, high=None):
    if isinstance(value, bool) or not isinstance(value, numbers.Integral):
        raise ValueError(f"{param}: expected an integer, got {value!r}")
    value = int(value)
    if value < low or (high is not None and value > high):
        bound = f"in [{low}, {high}]" if high is not None else f">= {low}"
        raise ValueError(f"{param}: {value} is out of range (expected an integer {bound})")
    return value


def _spec(fmt, granularity, block, row, scale="fp32", rounding="nearest", seed=0, default_row=None):
    spec = _lib.QuantSpec()
    spec.format = _format(fmt)
    spec.granularity = _choice("granularity", granularity, GRANULARITIES)
    if spec.granularity == GRANULARITIES["block"]:
        spec.group = _integer("block", block, 1)
    elif spec.granularity == GRANULARITIES["row"]:
        if row is None:
            row = default_row
        if row is None:
            raise ValueError("row: the row length is needed with granularity='row' (pass row=, "
                             "or a shape)")
        spec.group = _integer("row", row, 0)  # 0 is refused by the library, with its message
    spec.scale_mode = _choice("scale", scale, SCALES)
    spec.rounding = _choice("rounding", rounding, ROUNDINGS)
    spec.seed = _integer("seed", seed, 0, 2**64 - 1)
    return spec


class _Arg:
    """One array argument: its address, element count, prism_dtype, and where it lives
    (device None for host memory, a torch.device for CUDA). Holds the object (or the
    contiguous copy) alive for the call."""

    __slots__ = ("obj", "ptr", "numel", "dtype", "device", "is_torch", "shape")

    def __init__(self, obj, ptr, numel, dtype, device, is_torch, shape):
        self.obj, self.ptr, self.numel, self.dtype = obj, ptr, numel, dtype
        self.device, self.is_torch, self.shape = device, is_torch, tuple(shape)

    def tensor(self):
        return _lib.Tensor(self.ptr, self.numel, self.dtype)


def _numpy_dtype(dtype):
    """prism_dtype of a NumPy dtype (either byte order), or None."""
    return {np.float32: _F32, np.float16: _F16}.get(dtype.type)


def _torch_dtype(dtype):
    torch = _torch()
    return {torch.float32: _F32, torch.bfloat16: _BF16, torch.float16: _F16}.get(dtype)


def _arg(x, name, kinds, writeable=False):
    """The array argument `name`. kinds: 'float' (float32/bfloat16/float16), 'f32', 'codes'
    (uint8 or int8 bytes). Read-only host data that is not contiguous is copied;
    see the module's docstring."""
    wanted = {"float": "float32, float16 or (torch) bfloat16", "f32": "float32",
              "codes": "uint8 (or int8)"}[kinds]
    if isinstance(x, np.ndarray):
        if kinds == "codes":
            ok, dtype = x.dtype.type in (np.uint8, np.int8), None
        else:
            dtype = _numpy_dtype(x.dtype)
            ok = dtype is not None and (kinds == "float" or dtype == _F32)
        if not ok:
            raise ValueError(f"{name}: dtype {x.dtype} is not {wanted}")
        contiguous = x.flags.c_contiguous and x.dtype.isnative
        if writeable:
            if not contiguous or not x.flags.writeable:
                raise ValueError(f"{name}: must be a C-contiguous, writeable array in native byte "
                                 "order (it is written in place)")
        elif not contiguous:
            x = np.ascontiguousarray(x, dtype=x.dtype.newbyteorder("="))
        return _Arg(x, x.ctypes.data, x.size, dtype, None, False, x.shape)
    if _is_tensor(x):
        torch = _torch()
        if kinds == "codes":
            ok, dtype = x.dtype in (torch.uint8, torch.int8), None
        else:
            dtype = _torch_dtype(x.dtype)
            ok = dtype is not None and (kinds == "float" or dtype == _F32)
        if not ok:
            raise ValueError(f"{name}: dtype {x.dtype} is not {wanted}")
        if x.device.type not in ("cpu", "cuda"):
            raise ValueError(f"{name}: a tensor on {x.device} (prism takes CPU and CUDA tensors)")
        x = x.detach()
        if not x.is_contiguous():
            if writeable:
                raise ValueError(f"{name}: must be a contiguous tensor (it is written in place)")
            if x.device.type == "cuda":
                raise ValueError(f"{name}: the CUDA tensor is not contiguous; pass "
                                 f"{name}.contiguous() (prism copies only host data)")
            x = x.contiguous()
        device = x.device if x.device.type == "cuda" else None
        return _Arg(x, x.data_ptr(), x.numel(), dtype, device, True, x.shape)
    raise TypeError(f"{name}: expected a NumPy array or a torch tensor, got {type(x).__name__}")


def _place(args):
    """The CUDA device all args are on, or None when all are in host memory; ValueError when
    they are mixed."""
    devices = {a.device for a in args}
    if len(devices) > 1:
        where = ", ".join(sorted(str(d) if d is not None else "host" for d in devices))
        raise ValueError(f"arguments are in different places ({where}): pass NumPy arrays and "
                         "CPU tensors together, or tensors on one CUDA device")
    return devices.pop() if devices else None


def _out_dtype(dtype, name="dtype"):
    """prism_dtype of a dtype given as a name, a NumPy dtype or a torch dtype."""
    if isinstance(dtype, str) and dtype in DTYPES:
        return DTYPES[dtype]
    torch = _torch()
    if torch is not None and isinstance(dtype, torch.dtype):
        code = _torch_dtype(dtype)
    else:
        try:
            code = _numpy_dtype(np.dtype(dtype))
        except TypeError:
            code = None
    if code is None:
        raise ValueError(f"{name}: {dtype!r} is not one of {_names(DTYPES)}")
    return code


def _host_call(fn, *args):
    err = _lib.Error()
    _lib.raise_for(fn(*args, ctypes.byref(err)), err)


def _cuda_call(name, device, *args):
    """Runs a *_cuda kernel on torch's current stream of device."""
    lib = _lib.load()
    fn = getattr(lib.dll, name, None)
    if fn is None:
        raise PrismError(Status.UNAVAILABLE,
                         f"{lib.path} has no {name}: this libprism was built without CUDA kernels; "
                         "move the tensors to the CPU or rebuild with a CUDA toolkit")
    torch = _torch()
    err = _lib.Error()
    with torch.cuda.device(device):
        stream = torch.cuda.current_stream(device).cuda_stream
        status = fn(*args, ctypes.c_void_p(stream), ctypes.byref(err))
    _lib.raise_for(status, err)


def _layout(spec, numel):
    groups, group_len, code_bytes = ctypes.c_size_t(), ctypes.c_size_t(), ctypes.c_size_t()
    _host_call(_lib.load().prism_quant_layout, ctypes.byref(spec), numel, ctypes.byref(groups),
               ctypes.byref(group_len), ctypes.byref(code_bytes))
    return Layout(groups.value, group_len.value, code_bytes.value)


def _check_encoded(codes, scales, lay, fmt, numel):
    if codes.numel != lay.code_bytes:
        raise ValueError(f"codes: {codes.numel} bytes, but {numel} {Format(fmt).name.lower()} "
                         f"elements take {lay.code_bytes}")
    if scales.numel != lay.groups:
        raise ValueError(f"scales: {scales.numel} scales, but the layout has {lay.groups} groups")


def _empty(like, shape, dtype):
    """An uninitialised array of shape and prism_dtype dtype, of like's kind and place."""
    if like.is_torch:
        torch = _torch()
        tdtype = {_F32: torch.float32, _BF16: torch.bfloat16, _F16: torch.float16,
                  "u8": torch.uint8}[dtype]
        return torch.empty(shape, dtype=tdtype, device=like.device or "cpu")
    if dtype == _BF16:
        raise ValueError("dtype: 'bfloat16' needs torch tensors (NumPy has no bfloat16)")
    return np.empty(shape, dtype={_F32: np.float32, _F16: np.float16, "u8": np.uint8}[dtype])


# ---- layout and scalar helpers -------------------------------------------------------------------


def layout(fmt, numel, granularity="block", block=128, row=None):
    """How `numel` elements are quantized: Layout(groups, group_len, code_bytes).

    Checks the arguments as quantize does (the row length must divide numel: the library's
    message "group: N elements are not a whole number of rows of R" otherwise)."""
    spec = _spec(fmt, granularity, block, row)
    return _layout(spec, _integer("numel", numel, 0))


def code_bytes(fmt, numel):
    """Bytes of codes for numel elements: numel, or (numel + 1) // 2 for int4."""
    return layout(fmt, numel, "tensor").code_bytes


def groups(numel, granularity="block", block=128, row=None):
    """Number of scales (groups) for numel elements: 1 per tensor (0 when numel is 0), numel / row
    per row, ceil(numel / block) per block."""
    return layout(Format.INT8, numel, granularity, block, row).groups


def qmax(fmt):
    """The largest finite value of a format: 127, 448, 57344 or 7."""
    return float(_lib.load().prism_quant_qmax(_format(fmt)))


def _fp8(fmt):
    f = _format(fmt)
    if f not in (Format.FP8_E4M3, Format.FP8_E5M2):
        raise ValueError(f"fmt: {fmt!r} is not one of 'fp8_e4m3', 'fp8_e5m2'")
    return f


def f32_to_fp8(x, fmt):
    """The FP8 code (an int 0..255) of the binary32 value x: nearest even, saturating to the
    largest finite code (sign kept), every NaN to 0x7f (prism_f32_to_fp8)."""
    return int(_lib.load().prism_f32_to_fp8(float(x), _fp8(fmt)))


def fp8_to_f32(code, fmt):
    """The exact value of an FP8 code (prism_fp8_to_f32)."""
    return float(_lib.load().prism_fp8_to_f32(_integer("code", code, 0, 255), _fp8(fmt)))


# ---- kernels -------------------------------------------------------------------------------------


def quantize(x, fmt, granularity="block", block=128, scale="fp32", rounding="nearest", seed=0, *,
             row=None, return_nonfinite=False):
    """Quantizes x into (codes, scales), as include/prism/kernels.h defines.

    x: a NumPy array (float32, float16) or a torch tensor (float32, bfloat16, float16) on the
        CPU or a CUDA device, read in C order (a non-contiguous host input is copied first; a
        non-contiguous CUDA tensor raises ValueError).
    fmt: 'int8', 'fp8_e4m3', 'fp8_e5m2', 'int4', or a prism.Format member.
    granularity: 'tensor' (one scale), 'row' (one scale per row of x.shape[-1] elements, or of
        `row` elements when given), 'block' (one per `block` consecutive elements, the last
        block shorter).
    scale: 'fp32' (s = amax / qmax) or 'pow2' (the smallest power of two with qmax * s >= amax).
    rounding: 'nearest' (ties to even) or 'stochastic' (Philox keyed by `seed`, an integer in
        [0, 2**64): the same seed gives the same codes on every path and device).
    return_nonfinite: also return the number of NaN/Inf elements of x (coded 0, left out of
        the scales).

    Returns (codes, scales) or (codes, scales, nonfinite): codes a flat uint8 array of
    layout(...).code_bytes bytes (int4: two per byte, low nibble first), scales a flat float32
    array with one dequantization multiplier per group; NumPy arrays for a NumPy x, tensors on
    x's device for a tensor x.
    """
    a = _arg(x, "x", "float")
    ndim = len(a.shape)
    spec = _spec(fmt, granularity, block, row, scale, rounding, seed,
                 default_row=a.shape[-1] if ndim else 1)
    lay = _layout(spec, a.numel)
    codes = _empty(a, (lay.code_bytes,), "u8")
    scales = _empty(a, (lay.groups,), _F32)
    cptr = codes.data_ptr() if a.is_torch else codes.ctypes.data
    sptr = scales.data_ptr() if a.is_torch else scales.ctypes.data
    tensor = a.tensor()
    if a.device is not None:
        torch = _torch()
        bad = torch.zeros(1, dtype=torch.int64, device=a.device)  # unsigned long long on device
        _cuda_call("prism_quantize_cuda", a.device, ctypes.byref(spec), ctypes.byref(tensor),
                   cptr, sptr, bad.data_ptr())
        nonfinite = int(bad.item())
    else:
        bad = ctypes.c_uint64()
        _host_call(_lib.load().prism_quantize_cpu, ctypes.byref(spec), ctypes.byref(tensor), cptr,
                   sptr, ctypes.byref(bad))
        nonfinite = bad.value
    if return_nonfinite:
        return codes, scales, nonfinite
    return codes, scales


Counts = collections.namedtuple("Counts", ["saturated", "underflowed", "nonfinite", "bad_scale"])
Counts.__doc__ = """prism_quant_counts of one call: `saturated` finite elements whose code the
format's largest value replaced (the clamp changed it), `underflowed` finite non-zero elements
written as code 0, `nonfinite` NaN/Inf elements (code 0, in neither of the others), `bad_scale`
groups whose given scale was not finite and > 0 (quantize_scaled on CUDA data only: every element
code 0; on host data such scales raise)."""


def _counts_buffer(a):
    """Where a kernel writes its counts: a ctypes struct for host data, a device tensor of four
    int64 (the struct's four uint64) for CUDA data."""
    if a.device is not None:
        torch = _torch()
        return torch.zeros(4, dtype=torch.int64, device=a.device)
    return _lib.QuantCounts()


def _counts_of(buf):
    if isinstance(buf, _lib.QuantCounts):
        return Counts(buf.saturated, buf.underflowed, buf.nonfinite, buf.bad_scale)
    return Counts(*(int(v) for v in buf.tolist()))


def _counts_ptr(buf):
    return ctypes.byref(buf) if isinstance(buf, _lib.QuantCounts) else buf.data_ptr()


def quantize_counted(x, fmt, granularity="block", block=128, scale="fp32", rounding="nearest",
                     seed=0, *, row=None):
    """quantize(), plus what it clipped: returns (codes, scales, Counts).

    The codes and scales are quantize()'s, bit for bit; Counts(saturated, underflowed,
    nonfinite, bad_scale 0) are the call's (include/prism/kernels.h defines them: with nearest rounding an
    INT8 element saturates when |x / s| >= 127.5, INT4 >= 7.5, FP8 E4M3 > 464, E5M2 >= 61440).
    The arguments are quantize()'s."""
    a = _arg(x, "x", "float")
    ndim = len(a.shape)
    spec = _spec(fmt, granularity, block, row, scale, rounding, seed,
                 default_row=a.shape[-1] if ndim else 1)
    lay = _layout(spec, a.numel)
    codes = _empty(a, (lay.code_bytes,), "u8")
    scales = _empty(a, (lay.groups,), _F32)
    cptr = codes.data_ptr() if a.is_torch else codes.ctypes.data
    sptr = scales.data_ptr() if a.is_torch else scales.ctypes.data
    tensor = a.tensor()
    counts = _counts_buffer(a)
    if a.device is not None:
        _cuda_call("prism_quantize_counted_cuda", a.device, ctypes.byref(spec), ctypes.byref(tensor),
                   cptr, sptr, _counts_ptr(counts))
    else:
        _host_call(_lib.load().prism_quantize_counted_cpu, ctypes.byref(spec), ctypes.byref(tensor),
                   cptr, sptr, _counts_ptr(counts))
    return codes, scales, _counts_of(counts)


def quantize_scaled(x, scales, fmt, granularity="block", block=128, rounding="nearest", seed=0, *,
                    row=None):
    """Quantizes x with the caller's scales (one float32 per group, as layout() counts them):
    one pass over x. Returns (codes, amax, Counts): the codes as quantize() lays them out,
    amax a float32 array with each group's largest finite |x| (0 when none), for a
    delayed-scaling history, and the call's Counts (see quantize_counted).

    scales: float32, on the host or x's CUDA device; every one finite and > 0. On the host a
        bad one raises PrismInvalidError "scales[G]: V is not a finite scale > 0"; on the device
        the kernel checks them (prism_quantize_scaled_cuda never reads them on the host) and a
        bad one's group gets codes 0, counted in Counts.bad_scale (this wrapper reads the counts
        back to return them, which waits for the GPU; the C call does not). With the scales quantize() returns, the codes are
        quantize()'s.
    The other arguments are quantize()'s (there is no `scale`: the scales are given)."""
    a = _arg(x, "x", "float")
    s = _arg(scales, "scales", "f32")
    device = _place([a, s])
    ndim = len(a.shape)
    spec = _spec(fmt, granularity, block, row, "fp32", rounding, seed,
                 default_row=a.shape[-1] if ndim else 1)
    lay = _layout(spec, a.numel)
    if s.numel != lay.groups:
        raise ValueError(f"scales: {s.numel} scales, but the layout has {lay.groups} groups")
    codes = _empty(a, (lay.code_bytes,), "u8")
    amax = _empty(a, (lay.groups,), _F32)
    cptr = codes.data_ptr() if a.is_torch else codes.ctypes.data
    aptr = amax.data_ptr() if a.is_torch else amax.ctypes.data
    tensor = a.tensor()
    counts = _counts_buffer(a)
    if device is not None:
        _cuda_call("prism_quantize_scaled_cuda", device, ctypes.byref(spec), ctypes.byref(tensor),
                   s.ptr, cptr, aptr, _counts_ptr(counts))
    else:
        _host_call(_lib.load().prism_quantize_scaled_cpu, ctypes.byref(spec), ctypes.byref(tensor),
                   s.ptr, cptr, aptr, _counts_ptr(counts))
    return codes, amax, _counts_of(counts)


def scale_delayed(hist_max, margin, fmt):
    """The delayed-scaling scale (prism_quant_scale_delayed): hist_max * 2**margin rounded once
    to float32, then divided by qmax(fmt) in float32; 1.0 when hist_max is not a finite value
    > 0, FLT_MAX when it overflows, 2**-149 when it underflows to 0."""
    m = _integer("margin", margin, -(2**31), 2**31 - 1)
    return float(_lib.load().prism_quant_scale_delayed(float(hist_max), m, _format(fmt)))


def dequantize(codes, scales, fmt, numel=None, granularity="block", block=128, row=None,
               dtype=None, out=None):
    """Decodes codes and scales (as quantize returned them) into numel values.

    numel: the element count, or a shape (tuple, list, torch.Size): the result then has that
        shape, and with granularity 'row' the row length defaults to its last dimension. May be
        None when `out` is given (then out's size, and out's last dimension as the row length).
    fmt, granularity, block, row: as quantize was called (granularity 'row' needs `row` or a
        shape).
    dtype: 'float32' (exact), 'float16' or 'bfloat16' (torch only), rounded to nearest even;
        NumPy and torch dtypes are accepted too. Default: out's dtype, else float32.
    out: an array to write into (C-contiguous, writeable, numel elements, in the codes' place);
        returned as it is.

    Returns a NumPy array when codes is one, else a tensor on codes' device; flat unless numel
    was a shape. codes: uint8 (or int8) of the layout's code_bytes; scales: float32, one per
    group; they must be exactly those sizes (ValueError otherwise).
    """
    c = _arg(codes, "codes", "codes")
    s = _arg(scales, "scales", "f32")
    o = _arg(out, "out", "float", writeable=True) if out is not None else None
    if numel is None:
        if o is None:
            raise ValueError("numel: needed (an element count or a shape) when out is not given")
        shape, n, default_row = o.shape, o.numel, (o.shape[-1] if o.shape else 1)
    elif isinstance(numel, (tuple, list)):
        shape = tuple(_integer("numel", d, 0) for d in numel)
        n = int(np.prod(shape, dtype=np.int64)) if shape else 1
        default_row = shape[-1] if shape else 1
    else:
        n = _integer("numel", numel, 0)
        shape, default_row = (n,), (o.shape[-1] if o is not None and o.shape else None)
    spec = _spec(fmt, granularity, block, row, default_row=default_row)
    lay = _layout(spec, n)
    _check_encoded(c, s, lay, spec.format, n)
    if o is not None:
        if o.numel != n:
            raise ValueError(f"out: {o.numel} elements, but numel is {n}")
        if dtype is not None and _out_dtype(dtype) != o.dtype:
            raise ValueError(f"dtype: {dtype!r} differs from out's dtype")
        code = o.dtype
        result, optr = out, o.ptr
        device = _place([c, s, o])
    else:
        code = _F32 if dtype is None else _out_dtype(dtype)
        device = _place([c, s])
        result = _empty(c, shape, code)
        optr = result.data_ptr() if c.is_torch else result.ctypes.data
    if device is not None:
        _cuda_call("prism_dequantize_cuda", device, ctypes.byref(spec), c.ptr, s.ptr, n, optr, code)
    else:
        _host_call(_lib.load().prism_dequantize_cpu, ctypes.byref(spec), c.ptr, s.ptr, n, optr,
                   code)
    return result


def dequantize_accumulate(acc, codes, scales, fmt, granularity="block", block=128, row=None):
    """acc += dequantize(codes, scales) in float32, in place (the product rounded to float32,
    then the sum: two roundings, no fused multiply-add). Returns acc.

    acc: a float32 NumPy array or tensor, C-contiguous and writeable, in the codes' place; its
    size is the element count, and its last dimension the default row length for granularity
    'row'. The other arguments are as for dequantize."""
    a = _arg(acc, "acc", "f32", writeable=True)
    c = _arg(codes, "codes", "codes")
    s = _arg(scales, "scales", "f32")
    spec = _spec(fmt, granularity, block, row, default_row=a.shape[-1] if a.shape else 1)
    lay = _layout(spec, a.numel)
    _check_encoded(c, s, lay, spec.format, a.numel)
    device = _place([a, c, s])
    if device is not None:
        _cuda_call("prism_dequantize_accumulate_cuda", device, ctypes.byref(spec), c.ptr, s.ptr,
                   a.numel, a.ptr)
    else:
        _host_call(_lib.load().prism_dequantize_accumulate_cpu, ctypes.byref(spec), c.ptr, s.ptr,
                   a.numel, a.ptr)
    return acc


def relative_error(a, b):
    """||a - b|| / ||a|| over all elements, as a Python float (sums of squares in double).

    a and b: arrays or tensors of the same element count (any of the float dtypes, each its
    own), both in host memory or both on one CUDA device. ||a|| == 0 gives 0.0 when b is all
    zero too, else inf; a NaN or Inf in either gives nan."""
    x = _arg(a, "a", "float")
    y = _arg(b, "b", "float")
    device = _place([x, y])
    tx, ty = x.tensor(), y.tensor()
    if device is not None:
        torch = _torch()
        out = torch.empty(1, dtype=torch.float64, device=device)
        _cuda_call("prism_relative_error_cuda", device, ctypes.byref(tx), ctypes.byref(ty),
                   out.data_ptr())
        return float(out.item())
    out = ctypes.c_double()
    _host_call(_lib.load().prism_relative_error_cpu, ctypes.byref(tx), ctypes.byref(ty),
               ctypes.byref(out))
    return out.value


def _stats_dict(st):
    return {"l2_norm": st.l2_norm, "max_abs": st.max_abs, "mean": st.mean,
            "variance": st.variance, "numel": int(st.numel), "nonfinite": int(st.nonfinite)}


def block_tensors(blocks):
    """The C arguments of a multi-block call: (device, prism_tensor array, block_start array)
    for blocks, a list of lists of float arrays or tensors; device is None for host memory, else
    the one CUDA device they are all on."""
    args, start = [], [0]
    for i, block in enumerate(blocks):
        for j, t in enumerate(block):
            args.append(_arg(t, f"blocks[{i}][{j}]", "float"))
        start.append(len(args))
    device = _place(args)
    tensors = (_lib.Tensor * max(len(args), 1))(*[a.tensor() for a in args])
    return device, tensors, (ctypes.c_size_t * len(start))(*start)


def grad_stats_blocks(blocks):
    """The gradient statistics of many blocks in one call: blocks is a list of blocks, each a
    list of arrays or tensors (an empty block gives all zeros). Returns one dict per block, as
    grad_stats. All tensors of the call must be in host memory, or all on one CUDA device."""
    blocks = [list(b) if isinstance(b, (list, tuple)) else [b] for b in blocks]
    device, tensors, block_start = block_tensors(blocks)
    nblocks = len(blocks)
    if device is not None:
        torch = _torch()
        size = ctypes.sizeof(_lib.GradStats)
        out = torch.empty(max(nblocks, 1) * size, dtype=torch.uint8, device=device)
        _cuda_call("prism_grad_stats_blocks_cuda", device, tensors, block_start, nblocks,
                   out.data_ptr())
        raw = out.cpu().numpy().tobytes()
        stats = (_lib.GradStats * max(nblocks, 1)).from_buffer_copy(raw)
    else:
        stats = (_lib.GradStats * max(nblocks, 1))()
        _host_call(_lib.load().prism_grad_stats_blocks_cpu, tensors, block_start, nblocks, stats)
    return [_stats_dict(stats[b]) for b in range(nblocks)]


def grad_stats(tensors):
    """The statistics of DESIGN 3 over all elements of one block's tensors (a list of arrays or
    tensors, or a single one): a dict with l2_norm, max_abs, mean, variance (population) of the
    finite elements as floats, numel (every element) and nonfinite (NaN/Inf elements, left out
    of the other figures) as ints."""
    if isinstance(tensors, np.ndarray) or _is_tensor(tensors):
        tensors = [tensors]
    return grad_stats_blocks([list(tensors)])[0]


def has_cuda():
    """Whether the loaded libprism has the CUDA kernels (CUDA tensors are accepted)."""
    return _lib.load().has_cuda


def library_path():
    """The path of the loaded libprism (loading it if needed)."""
    return _lib.load().path
