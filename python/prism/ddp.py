"""Prism's quantized all-reduce inside PyTorch: a DistributedDataParallel communication hook
(DESIGN 10; re-exported by prism.torch).

    import prism.torch
    state = prism.torch.QuantizedAllReduceState(process_group=None, wire="fp8_e4m3",
                                                attachment=None, row_width=None, op="avg")
    ddp_model.register_comm_hook(state, prism.torch.quantized_allreduce_hook)
    ...
    state.wire_bytes   # payload bytes this rank sent so far (every call)
    state.bf16_bytes   # what a BF16 ring all-reduce of the same gradients would have sent
    state.calls        # buckets all-reduced

The algorithm is the one of include/prism/collectives.h, byte for byte (the same wire form, the
same kernels of libprism through prism.kernels, the same order of operations), so a list of
tensors all-reduced here comes out with exactly the bits the C collectives (MPI, NCCL) give for
the same inputs and world size, identical on every rank:
  1. every tensor flattened and cut into rows of `row_width` elements (its last row padded; a
     1-D tensor too, never one scale per element), the rows of all tensors in list order padded
     with empty rows to a multiple of the world size P; each row quantized with its own FP32
     scale (amax / qmax, nearest rounding); slice k (rows_per_rank rows: their codes, then their
     scales) belongs to rank k;
  2. all-to-all (the group's all_to_all_single): slice k to rank k;
  3. the P contributions of this rank's slice dequantized and summed in FP32 in rank order
     0..P-1 (product and sum each rounded: prism.kernels.dequantize_accumulate), saturated to
     +-FLT_MAX, divided by P for op "avg" (one correctly rounded binary32 division);
  4. the slice requantized with new per-row scales;
  5. all-gather of the slices; every rank dequantizes every row into its tensors (in their own
     dtype: float32, bfloat16 or float16).
Before the data every rank all-gathers a small header (the call, wire, op, row width, tensor
count, rows, a hash of the sizes, its NaN/Inf count, and whether it refused its own tensors), as
the C collectives do, so a rank that passes other sizes or formats raises ValueError on every
rank instead of hanging. NaN/Inf gradients travel as 0 (as in C) and are counted in
`state.nonfinite` (the whole job's count, the same on every rank): the hook does not make them
visible in the gradients, so a loss scaler that looks for them must read that counter.

wire: a low format ("int8", "fp8_e4m3", "fp8_e5m2", "int4"): every bucket goes in that format;
or "map": each parameter goes in the precision its block has in `attachment`'s current map
(prism.torch.Attachment: `blocks` and `precisions()`, read at every bucket). Within a bucket the
parameters of each low format form one Prism all-reduce (in bucket order, formats in the order
int8, fp8_e4m3, fp8_e5m2, int4); the parameters of BF16 blocks, and those in no block, are
all-reduced unquantized by the group's all_reduce in the bucket's dtype (then divided by P for
"avg"). Maps reach the ranks through their own agents, so a rank may take a map a step after
another: each map-mode bucket therefore starts with one all-gather of every rank's
per-parameter format codes (a byte each; not counted in wire_bytes, like the header), and every
rank applies the same rule to it: a parameter whose format is the same on every rank goes in
that format, one whose format differs goes unquantized for this bucket (counted in
`state.map_disagreements`). The ranks always call the same collectives with the same sizes:
never an exception, never a wait until the group's timeout because of the map.

Bytes (per rank, headers not counted, as in prism_coll_stats): a Prism all-reduce sends
2 (P-1) rows_per_rank (code bytes of a row + 4) (layout_of(...).wire_bytes): the all-to-all and
the all-gather each send every slice but this rank's own once; an unquantized part counts what a
ring all-reduce sends, 2 (P-1) n e / P rounded down (n elements of e bytes). bf16_bytes adds, per
bucket, 4 n (P-1) / P rounded down (n: the bucket's elements), the figure the C collectives
publish as their BF16 equivalent.

The hook works synchronously: it returns a completed torch.futures.Future holding the bucket's
buffer. On CUDA tensors (a libprism with its CUDA kernels, an NCCL group) every step runs on the
current stream with the same kernels, as the NCCL backend of the C collectives does.
"""

import collections

import numpy as np
import torch
import torch.distributed as dist

from . import kernels

WIRES = ("int8", "fp8_e4m3", "fp8_e5m2", "int4")
OPS = ("sum", "avg")
SCALES = ("fp32", "pow2")  # quantized_allreduce's own scales (prism_coll_spec.scale_mode)
SCALE_MODES = ("current", "pow2", "delayed", "static")  # the job's config key scale_mode (DESIGN 4.7)
_QMAX = {"int8": 127.0, "fp8_e4m3": 448.0, "fp8_e5m2": 57344.0, "int4": 7.0}
_SMALLEST = float(np.float32(2.0 ** -149))
ROW_WIDTH_DEFAULT = 256
ROW_WIDTH_MAX = 65536
_DTYPES = {torch.float32: 0, torch.bfloat16: 1, torch.float16: 2}
_FLT_MAX = float(np.finfo(np.float32).max)
# The header's fields, as collectives_internal.h's prism_coll_header (the precisions of
# prism_precision, the ops of prism_coll_op).
_MAGIC = 0x5052534D434F4C00 | 1  # "PRSMCOL\0" | all-reduce
_WIRE_CODE = {"int8": 1, "fp8_e4m3": 2, "fp8_e5m2": 3, "int4": 4}
_OP_CODE = {"sum": 0, "avg": 1}
_HEADER_WORDS = 10
# Map mode's per-parameter format codes (one byte each in the agreement all-gather).
_FORMAT_CODE = {"bf16": 0, "int8": 1, "fp8_e4m3": 2, "fp8_e5m2": 3, "int4": 4}
_FORMAT_NAME = {v: k for k, v in _FORMAT_CODE.items()}

Layout = collections.namedtuple("Layout", ["rows", "padded_rows", "rows_per_rank", "row_bytes", "wire_bytes",
                                           "row_width"])
Layout.__doc__ = """prism_coll_layout: `rows` of the tensors, `padded_rows` (a multiple of the world
size), `rows_per_rank`, `row_bytes` (codes + 4 bytes of scale), `wire_bytes` (what one rank sends
in an all-reduce), `row_width`."""


def _code_bytes(wire, n):
    return n // 2 + n % 2 if wire == "int4" else n


def _check_wire(wire, allow_map=False):
    if wire in WIRES or (allow_map and wire == "map"):
        return wire
    known = WIRES + (("map",) if allow_map else ())
    raise ValueError(f"wire: unknown format {wire!r} (known: {', '.join(known)})")


def _check_op(op):
    if op not in OPS:
        raise ValueError(f"op: unknown value {op!r} (known: sum, avg)")
    return op


def _check_row_width(row_width):
    if row_width is None or row_width == 0:
        return ROW_WIDTH_DEFAULT
    if (isinstance(row_width, bool) or not isinstance(row_width, int) or row_width % 8 or row_width < 8
            or row_width > ROW_WIDTH_MAX):
        raise ValueError(f"row_width: {row_width!r} is not a multiple of 8 from 8 to {ROW_WIDTH_MAX} "
                         f"(None: {ROW_WIDTH_DEFAULT})")
    return row_width


def layout_of(numels, wire, world, row_width=None):
    """The row layout of tensors of these element counts on `world` ranks (prism_coll_layout_of)."""
    _check_wire(wire)
    w = _check_row_width(row_width)
    if world < 1:
        raise ValueError(f"world: {world} ranks (at least 1)")
    rows = sum(n // w + (n % w != 0) for n in numels)
    rpr = rows // world + (rows % world != 0)
    row_bytes = _code_bytes(wire, w) + 4
    return Layout(rows, rpr * world, rpr, row_bytes, 2 * (world - 1) * rpr * row_bytes, w)


def _sizes_hash(numels):
    """FNV-1a 64 over the sizes as 64-bit little-endian words (collectives.c's sizes_hash)."""
    h = 14695981039346656037
    for n in numels:
        for b in range(8):
            h ^= (n >> (8 * b)) & 0xFF
            h = (h * 1099511628211) & 0xFFFFFFFFFFFFFFFF
    return h


def _signed(u):
    return u - (1 << 64) if u >= 1 << 63 else u


def _group_of(process_group):
    return process_group if process_group is not None else dist.group.WORLD


def _exchange_headers(mine, group, world, device):
    """Every rank's header (a list of `world` lists of ints, in rank order)."""
    h = torch.tensor([_signed(v) for v in mine], dtype=torch.int64, device=device)
    if world == 1:
        return [mine]
    out = torch.empty(world, _HEADER_WORDS, dtype=torch.int64, device=device)
    dist.all_gather(list(out.unbind(0)), h, group=group)
    return [[v & 0xFFFFFFFFFFFFFFFF for v in row] for row in out.cpu().tolist()]


def _check_headers(all_headers, rank):
    """collectives.c's check_headers: the same verdict on every rank."""
    names = {v: k for k, v in _WIRE_CODE.items()}
    ops = {v: k for k, v in _OP_CODE.items()}
    if all_headers[rank][1]:
        return None  # this rank refused: it raises its own error
    for k, h in enumerate(all_headers):
        if h[1]:
            return f"rank {k} refused the call; no rank sent data"
    h0 = all_headers[0]
    for k, h in enumerate(all_headers[1:], 1):
        if h[0] != h0[0]:
            return f"call: rank 0 and rank {k} called different collectives"
        if h[2] != h0[2]:
            return f"wire: rank 0 passed {names.get(h0[2], '?')}, rank {k} {names.get(h[2], '?')}"
        if h[3] != h0[3]:
            return f"op: rank 0 passed {ops.get(h0[3], '?')}, rank {k} {ops.get(h[3], '?')}"
        if h[4] != h0[4]:
            return f"scale_mode: rank 0 passed {SCALES[h0[4]] if h0[4] < 2 else '?'}, rank {k} " \
                   f"{SCALES[h[4]] if h[4] < 2 else '?'}"
        if h[5] != h0[5]:
            return f"row_width: rank 0 uses {h0[5]}, rank {k} {h[5]}"
        if h[6] != h0[6]:
            return f"tensors: rank 0 passed {h0[6]} tensors, rank {k} {h[6]}"
        if h[7] != h0[7]:
            return f"tensors: rank 0's tensors make {h0[7]} rows, rank {k}'s {h[7]}"
        if h[8] != h0[8]:
            return f"tensors: rank 0 and rank {k} passed tensors of different sizes (the same number of rows)"
    return None


class ScaleModeMismatch(ValueError):
    """Raised on every rank when the ranks passed different `scale`s to quantized_allreduce (the
    same verdict everywhere, before any data moved)."""


def _finish_sum(acc, divisor):
    """acc clamped to [-FLT_MAX, FLT_MAX], then divided by divisor when divisor > 1: one
    correctly rounded binary32 division per element (NumPy's on the CPU, never a multiplication
    by the reciprocal, which differs for divisors that are not powers of two)."""
    acc.clamp_(-_FLT_MAX, _FLT_MAX)
    if divisor > 1:
        if acc.device.type == "cpu":
            a = acc.numpy()
            np.divide(a, np.float32(divisor), out=a)
        else:
            acc.div_(torch.full_like(acc, float(divisor)))
    return acc


def _check_scale(scale):
    if scale not in SCALES:
        raise ValueError(f"scale: unknown value {scale!r} (known: {', '.join(SCALES)})")
    return scale


def row_amax(t, w):
    """Each row's largest finite |x| (0 when none) of tensor t cut into rows of w elements (its
    last row padded with zeros), as float32: the amax the kernels take a row's scale from."""
    flat = t.reshape(-1)
    n = flat.numel()
    r = n // w + (n % w != 0)
    x = torch.zeros(r * w, dtype=torch.float32, device=flat.device)
    x[:n] = flat.float().abs()
    x = torch.where(torch.isfinite(x), x, torch.zeros_like(x))
    return x.view(r, w).amax(dim=1)


def delayed_scales(hist_max, margin, fmt):
    """prism.kernels.scale_delayed (prism_quant_scale_delayed) of every element of a float32
    tensor, the same bits: hist_max * 2**margin rounded once to float32, divided by qmax(fmt) in
    float32; 1 where hist_max is not a finite value > 0, FLT_MAX where the result overflows,
    2**-149 where it underflows to 0."""
    h = hist_max.float()
    m = max(-300, min(300, int(margin)))
    t = (h.double() * (2.0 ** m)).float()  # exact in float64, then one rounding, as C
    s = t / torch.tensor(_QMAX[fmt], dtype=torch.float32, device=h.device)
    s = torch.where(torch.isfinite(s), s, torch.full_like(s, _FLT_MAX))
    s = torch.where(s > 0, s, torch.full_like(s, _SMALLEST))
    usable = (h > 0) & torch.isfinite(h)
    return torch.where(usable, s, torch.ones_like(s))


def quantized_allreduce(tensors, wire, op="avg", row_width=None, process_group=None, scale="fp32",
                        scales_in=None, scales_out=None, want_amax=False):
    """All-reduces `tensors` in place with Prism's algorithm (the module's docstring): every
    tensor becomes the quantized sum (op "sum") or average ("avg") over the group's ranks, the
    same bits on every rank and the bits prism_coll_allreduce gives for the same inputs.

    tensors: contiguous float32, bfloat16 or float16 tensors (each its own dtype and shape), all
    on one device; every rank passes the same sizes in the same order. wire: "int8", "fp8_e4m3",
    "fp8_e5m2", "int4". row_width: elements per row and scale (None: 256; a multiple of 8 up to
    65536). scale: "fp32" (amax / qmax) or "pow2" (prism_coll_spec.scale_mode; every rank the
    same). Collective: every rank of the group calls it.

    Caller-given scales (the hook's delayed and static modes; no C equivalent): scales_in, one
    float32 scale per row of this rank's tensors (layout_of(...).rows, in order), replaces step
    1's; scales_out, one per row of this rank's slice (rows_per_rank), replaces step 4's. Every
    rank still gets the same bits: each contribution and each slice travels with its scales.
    want_amax: also return "amax_in" (each of this rank's rows' amax) and "amax_out" (each of
    its slice's rows'), float32 tensors, for a delayed-scaling history.

    Returns {"bytes_sent": payload bytes this rank sent (headers not counted), "bf16_bytes": what
    a BF16 ring all-reduce of the same elements sends, "nonfinite": NaN/Inf inputs of all ranks
    (sent as 0), "saturated": elements this rank's quantizations under given scales clamped}.
    ValueError names the argument at fault; a mismatch between ranks raises ValueError on every
    rank (ScaleModeMismatch, a ValueError, when `scale` is the first field found to differ: the
    call, wire and op agree)."""
    _check_wire(wire)
    _check_op(op)
    _check_scale(scale)
    w = _check_row_width(row_width)
    tensors = list(tensors)
    group = _group_of(process_group)
    world = dist.get_world_size(group)
    rank = dist.get_rank(group)
    devices = {t.device for t in tensors if isinstance(t, torch.Tensor)}
    device = next(iter(devices)) if len(devices) == 1 else torch.device("cpu")

    refusal = None
    if len(devices) > 1:
        refusal = ValueError(f"tensors: on several devices ({', '.join(sorted(map(str, devices)))})")
    for i, t in enumerate(tensors):
        if refusal:
            break
        if not isinstance(t, torch.Tensor):
            refusal = ValueError(f"tensors[{i}]: not a tensor")
        elif t.dtype not in _DTYPES:
            refusal = ValueError(f"tensors[{i}]: dtype {t.dtype} (float32, bfloat16 or float16)")
        elif not t.is_contiguous():
            refusal = ValueError(f"tensors[{i}]: not contiguous")
    numels = [t.numel() for t in tensors] if refusal is None else []
    lay = layout_of(numels, wire, world, w)
    code_row = _code_bytes(wire, w)
    rpr = lay.rows_per_rank
    codes_block = rpr * code_row  # bytes of a slice's codes, then rpr * 4 of scales
    nonfinite = 0
    saturated = 0
    if refusal is None and scales_in is not None and tuple(scales_in.shape) != (lay.rows,):
        refusal = ValueError(f"scales_in: {tuple(scales_in.shape)}, the tensors make {lay.rows} rows")
    if refusal is None and scales_out is not None and tuple(scales_out.shape) != (rpr,):
        refusal = ValueError(f"scales_out: {tuple(scales_out.shape)}, a slice has {rpr} rows")
    # Given scales are checked before the headers, so that a bad one is a refusal every rank sees
    # (on CUDA the kernels would write its rows as 0 and carry on).
    for name, given in (("scales_in", scales_in), ("scales_out", scales_out)):
        if refusal is None and given is not None:
            bad = ~(torch.isfinite(given) & (given > 0))
            if bool(bad.any()):
                g = int(bad.nonzero()[0, 0])
                refusal = ValueError(f"{name}[{g}]: {float(given[g])} is not a finite scale > 0")
    amax_in = torch.zeros(lay.rows, dtype=torch.float32, device=device) if want_amax else None

    # Step 1: every row quantized into its place; empty padding rows: codes 0, scale 1.
    codes = torch.zeros(lay.padded_rows, code_row, dtype=torch.uint8, device=device)
    scales = torch.ones(lay.padded_rows, dtype=torch.float32, device=device)
    if refusal is None:
        g = 0
        try:
            for t in tensors:
                n = t.numel()
                if n == 0:
                    continue
                r = n // w + (n % w != 0)
                if scales_in is None:
                    c, s, bad = kernels.quantize(t.reshape(-1), wire, "block", w, scale=scale, return_nonfinite=True)
                    if want_amax:
                        amax_in[g:g + r] = row_amax(t, w)
                else:
                    s = scales_in[g:g + r].float().contiguous()
                    c, a, counts = kernels.quantize_scaled(t.reshape(-1), s, wire, "block", w)
                    bad = counts.nonfinite
                    saturated += counts.saturated
                    if want_amax:
                        amax_in[g:g + r] = a
                codes[g:g + r].view(-1)[:c.numel()] = c
                scales[g:g + r] = s
                nonfinite += bad
                g += r
        except (ValueError, RuntimeError) as e:
            refusal = e

    mine = [_MAGIC, 1 if refusal else 0, _WIRE_CODE[wire], _OP_CODE[op], SCALES.index(scale), w, len(tensors),
            lay.rows, _sizes_hash(numels), nonfinite]
    headers = _exchange_headers(mine, group, world, device)
    if refusal is not None:
        raise refusal
    problem = _check_headers(headers, rank)
    if problem:
        raise (ScaleModeMismatch if problem.startswith("scale_mode:") else ValueError)(problem)
    stats = {"bytes_sent": lay.wire_bytes, "bf16_bytes": 4 * sum(numels) * (world - 1) // world,
             "nonfinite": sum(h[9] for h in headers), "saturated": saturated}
    if want_amax:
        stats["amax_in"] = amax_in
        stats["amax_out"] = torch.zeros(rpr, dtype=torch.float32, device=device)
    if rpr == 0:
        return stats

    # The wire form: slice k = its rows' codes, then their scales (host byte order, as C).
    send = torch.cat([codes.view(world, codes_block), scales.view(torch.uint8).view(world, 4 * rpr)], dim=1)
    send = send.contiguous()
    # Step 2: all-to-all.
    if world > 1:
        recv = torch.empty_like(send)
        dist.all_to_all_single(recv, send, group=group)
    else:
        recv = send
    # Step 3: sums in FP32, in rank order; saturation; AVG.
    acc = torch.zeros(rpr * w, dtype=torch.float32, device=device)
    for q in range(world):
        kernels.dequantize_accumulate(acc, recv[q, :codes_block], recv[q, codes_block:].view(torch.float32), wire,
                                      granularity="row", row=w)
    _finish_sum(acc, world if op == "avg" else 1)
    # Step 4: the slice requantized with new scales (or the caller's).
    if scales_out is None:
        c2, s2 = kernels.quantize(acc, wire, "row", row=w, scale=scale)
        if want_amax:
            stats["amax_out"] = row_amax(acc, w)
    else:
        s2 = scales_out.float().contiguous()
        c2, a2, counts = kernels.quantize_scaled(acc, s2, wire, "row", row=w)
        stats["saturated"] += counts.saturated
        if want_amax:
            stats["amax_out"] = a2
    mine_slice = torch.cat([c2, s2.view(torch.uint8)])
    # Step 5: all-gather, and every row back into its tensor.
    if world > 1:
        gathered = torch.empty_like(send)
        dist.all_gather(list(gathered.unbind(0)), mine_slice, group=group)
    else:
        gathered = mine_slice.view(1, -1)
    all_codes = gathered[:, :codes_block].reshape(lay.padded_rows, code_row)
    all_scales = gathered[:, codes_block:].contiguous().view(torch.float32).reshape(lay.padded_rows)
    g = 0
    for t in tensors:
        n = t.numel()
        if n == 0:
            continue
        r = n // w + (n % w != 0)
        kernels.dequantize(all_codes[g:g + r].reshape(-1)[:_code_bytes(wire, n)], all_scales[g:g + r].contiguous(),
                           wire, granularity="block", block=w, out=t.view(-1))
        g += r
    return stats


class QuantizedAllReduceState:
    """The state of quantized_allreduce_hook: its arguments and its counters.

    process_group: the group DDP all-reduces over (None: the default group, looked up at each
    call). wire: "int8", "fp8_e4m3", "fp8_e5m2", "int4", or "map" (needs `attachment`, a
    prism.torch.Attachment or anything with `blocks` and `precisions()`). row_width: None (256)
    or a multiple of 8 up to 65536. op: "avg" (DDP's default: the mean gradient) or "sum".
    scale_mode (DESIGN 4.7's config key, for the gradients): "current" (per-row FP32 scales of
    each call, the C collectives' default), "pow2" (the same rounded up to powers of two, the C
    collectives' POW2), "delayed" (a row's scale from the max of its amax over the bucket's last
    amax_history_len calls, times 2**scale_margin: this rank's rows and its slice's rows apart),
    "static" (the scales of the bucket's first call, kept), or "job": the job's scale_mode,
    amax_history_len and scale_margin as `attachment`'s client shows them at each bucket, so a
    PATCH of the job's config reaches the hook. None (the default): "job" with an attachment
    that has a client (a prism.torch.Attachment), else "current". Every rank still gets the same bits in every mode
    (each contribution and slice travels with its scales); ranks that change between pow2 and
    another mode at different steps redo that call with FP32 headers (scale_mismatches). Under
    delayed and static the first call of a bucket runs with current scales.

    Counters (this rank, all calls): wire_bytes, bf16_bytes, calls (buckets), collectives
    (Prism all-reduces run), plain_allreduces (unquantized parts in map mode), nonfinite (NaN/Inf
    gradients of the whole job, sent as 0), elements_low / elements_high (gradient elements sent
    quantized / unquantized); in map mode also map_disagreements (parameters, summed over
    buckets, whose format differed between ranks and so went unquantized: the same figure on
    every rank), map_exchanges and map_exchange_bytes (the agreement all-gathers and the bytes
    this rank sent in them, not in wire_bytes, as headers are not), map_errors (this rank's
    buckets whose map could not be read: sent unquantized from its side); saturated (elements
    this rank's quantizations under delayed or static scales clamped), scale_mismatches."""

    def __init__(self, process_group=None, wire="fp8_e4m3", attachment=None, row_width=None, op="avg",
                 scale_mode=None, amax_history_len=16, scale_margin=0):
        self.wire = _check_wire(wire, allow_map=True)
        self.op = _check_op(op)
        self.row_width = _check_row_width(row_width)
        if scale_mode is None:
            scale_mode = "job" if attachment is not None and hasattr(attachment, "client") else "current"
        if scale_mode not in SCALE_MODES + ("job",):
            raise ValueError(f"scale_mode: unknown value {scale_mode!r} (known: {', '.join(SCALE_MODES)}, job)")
        if scale_mode == "job" and (attachment is None or not hasattr(attachment, "client")):
            raise ValueError("attachment: scale_mode='job' needs an Attachment (its client's state)")
        if (isinstance(amax_history_len, bool) or not isinstance(amax_history_len, int)
                or not 1 <= amax_history_len <= 1024):
            raise ValueError(f"amax_history_len: {amax_history_len!r} is not an integer from 1 to 1024")
        if isinstance(scale_margin, bool) or not isinstance(scale_margin, int) or not -32 <= scale_margin <= 32:
            raise ValueError(f"scale_margin: {scale_margin!r} is not an integer from -32 to 32")
        self.scale_mode = scale_mode
        self.amax_history_len = amax_history_len
        self.scale_margin = scale_margin
        if wire == "map":
            if attachment is None:
                raise ValueError("attachment: wire='map' needs an Attachment (its blocks and precisions())")
            if not hasattr(attachment, "blocks") or not callable(getattr(attachment, "precisions", None)):
                raise ValueError("attachment: needs `blocks` and `precisions()` (a prism.torch.Attachment)")
        self.process_group = process_group
        self.attachment = attachment
        self.wire_bytes = 0
        self.bf16_bytes = 0
        self.calls = 0
        self.collectives = 0
        self.plain_allreduces = 0
        self.nonfinite = 0
        self.elements_low = 0
        self.elements_high = 0
        self.map_disagreements = 0
        self.map_exchanges = 0
        self.map_exchange_bytes = 0
        self.map_errors = 0
        self.saturated = 0  # elements clamped by this rank's quantizations under delayed or static scales
        self.scale_mismatches = 0  # calls whose ranks were in different per-step modes: redone in current
        self._block_of = None  # id(parameter) -> block index, built at the first call in map mode
        self._histories = {}  # (bucket key, wire) -> _History, under delayed and static

    def _formats(self, params):
        """Each parameter's wire format in this rank's current map ("bf16": unquantized). A map
        that cannot be read (precisions() raising) counts in map_errors and sends the bucket
        unquantized from this rank's side: the agreement below then keeps the ranks together."""
        if self.wire != "map":
            return [self.wire] * len(params)
        try:
            if self._block_of is None:
                self._block_of = {id(p): b for b, blk in enumerate(self.attachment.blocks)
                                  for p in blk.parameters()}
            precisions = list(self.attachment.precisions())
        except Exception:  # noqa: BLE001 -- training never dies because of Prism's map
            self.map_errors += 1
            return ["bf16"] * len(params)
        out = []
        for p in params:
            b = self._block_of.get(id(p))
            fmt = precisions[b] if b is not None and b < len(precisions) else "bf16"
            out.append(fmt if fmt in WIRES else "bf16")
        return out

    def _agree(self, formats, group, world, device):
        """The formats every rank uses for this bucket, the same list on every rank: one
        all-gather of each rank's per-parameter format codes (a byte each), then a parameter
        keeps its format where every rank gave the same one and goes unquantized ("bf16") where
        they differ (counted in map_disagreements). Maps reach ranks through their own agents and
        a rank may take a map a step later than another; without this the ranks would call
        different collectives (one a Prism all-reduce, another the plain all_reduce) and wait
        for each other until the group's timeout. DDP's buckets hold the same parameters on
        every rank (it checks at construction), so the tensors gathered have the same size."""
        if world == 1 or not formats:
            return formats
        mine = torch.tensor([_FORMAT_CODE[f] for f in formats], dtype=torch.uint8, device=device)
        out = torch.empty(world, len(formats), dtype=torch.uint8, device=device)
        dist.all_gather(list(out.unbind(0)), mine, group=group)
        self.map_exchanges += 1
        self.map_exchange_bytes += (world - 1) * len(formats)
        codes = out.cpu().tolist()
        agreed = []
        for i in range(len(formats)):
            if all(row[i] == codes[0][i] for row in codes):
                agreed.append(_FORMAT_NAME[codes[0][i]])
            else:
                agreed.append("bf16")
                self.map_disagreements += 1
        return agreed

    def _mode(self):
        """(scale mode, amax_history_len, scale_margin) for this bucket: the state's, or under
        "job" the job's as the attachment's client shows it now (current when it cannot be read)."""
        if self.scale_mode != "job":
            return self.scale_mode, self.amax_history_len, self.scale_margin
        try:
            s = self.attachment.client.state()
            mode = s["scale_mode"] if s["scale_mode"] in SCALE_MODES else "current"
            return mode, int(s["amax_history_len"]) or 16, int(s["scale_margin"])
        except Exception:  # noqa: BLE001 -- training never dies because of Prism's state
            return "current", 16, 0

    def _allreduce_part(self, part, fmt, group, world, key):
        """One Prism all-reduce of `part` in `fmt` under the bucket's scale mode: current and pow2
        as the C collectives (scale fp32 / pow2); delayed and static with the part's history's
        scales (quantized_allreduce's scales_in / scales_out)."""
        mode, hist_len, margin = self._mode()
        h, sin, sout = None, None, None
        if mode in ("delayed", "static"):
            lay = layout_of([v.numel() for v in part], fmt, world, self.row_width)
            h = self._histories.get((key, fmt))
            if h is None or not h.fits(mode, hist_len, margin, lay.rows, lay.rows_per_rank):
                h = _History(mode, hist_len, margin, lay.rows, lay.rows_per_rank)
                self._histories[(key, fmt)] = h
            sin, sout = h.scales(fmt)

        def call(scale):
            return quantized_allreduce(part, fmt, self.op, self.row_width, group, scale=scale, scales_in=sin,
                                       scales_out=sout, want_amax=h is not None)

        try:
            st = call("pow2" if mode == "pow2" else "fp32")
        except ScaleModeMismatch:
            # Ranks that took a change of the job's mode at different steps (one pow2, one not):
            # every rank got this verdict from the headers before any data moved, and every rank
            # does the call again with fp32 headers (each keeps its own scales: they travel).
            self.scale_mismatches += 1
            st = call("fp32")
        if h is not None:
            h.push(st["amax_in"], st["amax_out"])
            self.saturated += st["saturated"]
        return st

    def allreduce_bucket(self, buffer, params, key=None):
        """All-reduces one bucket in place: `buffer` the flat gradients of `params`, one after the
        other (DDP's bucket layout). key: what identifies the bucket from call to call for the
        delayed and static histories (the hook passes the bucket's index; None: its parameters).
        Collective."""
        group = _group_of(self.process_group)
        world = dist.get_world_size(group)
        flat = buffer.view(-1)
        views, offset = [], 0
        for p in params:
            n = p.numel()
            views.append(flat[offset:offset + n])
            offset += n
        if offset != flat.numel():
            raise ValueError(f"bucket: its parameters have {offset} elements, its buffer {flat.numel()}")
        formats = self._formats(params)
        if self.wire == "map":
            formats = self._agree(formats, group, world, buffer.device)
        for fmt in WIRES:
            part = [v for v, f in zip(views, formats) if f == fmt]
            if not part:
                continue
            st = self._allreduce_part(part, fmt, group, world,
                                      key if key is not None else tuple(id(p) for p in params))
            self.wire_bytes += st["bytes_sent"]
            self.nonfinite += st["nonfinite"]
            self.collectives += 1
            self.elements_low += sum(v.numel() for v in part)
        high = [v for v, f in zip(views, formats) if f == "bf16"]
        if high:
            n = sum(v.numel() for v in high)
            joined = torch.cat(high) if len(high) > 1 else high[0].clone()
            if joined.dtype == torch.bfloat16 and world > 1 and dist.get_backend(group) == "gloo":
                joined = joined.float()  # gloo has no bfloat16 sum: sent (and counted) as float32
            if world > 1:
                dist.all_reduce(joined, group=group)
            if self.op == "avg" and world > 1:
                joined.div_(world)
            offset = 0
            for v in high:
                v.copy_(joined[offset:offset + v.numel()])
                offset += v.numel()
            self.wire_bytes += 2 * (world - 1) * n * joined.element_size() // world
            self.plain_allreduces += 1
            self.elements_high += n
        self.bf16_bytes += 4 * flat.numel() * (world - 1) // world
        self.calls += 1
        return buffer


class _History:
    """One bucket part's scales under delayed or static scaling (DESIGN 4.7 for gradients).
    delayed: the rows' amax of the last hist_len calls, this rank's rows (step 1) and its slice's
    (step 4) apart; a row's scale is prism_quant_scale_delayed(max over them, margin, format).
    static: the amax of the first call, kept: its FP32 scales for every later call. The first
    call of either has no history and runs with the current FP32 scales."""

    def __init__(self, mode, hist_len, margin, rows, rows_per_rank):
        self.mode, self.hist_len, self.margin = mode, hist_len, margin
        self.rows, self.rpr = rows, rows_per_rank
        self.ins, self.outs = [], []  # amax tensors, oldest first (static: the first call's only)

    def fits(self, mode, hist_len, margin, rows, rows_per_rank):
        return (self.mode, self.hist_len, self.margin, self.rows, self.rpr) == (mode, hist_len, margin, rows,
                                                                              rows_per_rank)

    def scales(self, fmt):
        """(scales_in, scales_out) for the next call; (None, None) before the first."""
        if not self.ins:
            return None, None
        margin = 0 if self.mode == "static" else self.margin
        sin = delayed_scales(torch.stack(self.ins).amax(dim=0), margin, fmt)
        sout = delayed_scales(torch.stack(self.outs).amax(dim=0), margin, fmt)
        return sin, sout

    def push(self, amax_in, amax_out):
        if self.mode == "static" and self.ins:
            return
        self.ins.append(amax_in)
        self.outs.append(amax_out)
        if len(self.ins) > self.hist_len:
            del self.ins[0]
            del self.outs[0]


def quantized_allreduce_hook(state, bucket):
    """DDP communication hook (DistributedDataParallel.register_comm_hook(state, this)): all-reduces
    the bucket's gradients with Prism's algorithm in the format state.wire says, counts the bytes
    in `state`, and returns a completed Future holding the bucket's buffer."""
    buffer = bucket.buffer()
    key = bucket.index() if hasattr(bucket, "index") else None
    state.allreduce_bucket(buffer, list(bucket.parameters()), key=key)
    fut = torch.futures.Future()
    fut.set_result(buffer)
    return fut


__all__ = ["Layout", "OPS", "QuantizedAllReduceState", "SCALES", "SCALE_MODES", "ScaleModeMismatch", "WIRES",
           "delayed_scales", "layout_of", "quantized_allreduce", "quantized_allreduce_hook", "row_amax"]
