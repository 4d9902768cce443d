"""Prism for PyTorch: attach to a model's list of blocks (DESIGN 2, 4.5, 9).

    import prism.torch
    pt = prism.torch.attach(model.layers, job_id="run-7", rank=rank, world_size=world,
                            model_id="my-model@v3")
    for step, batch in enumerate(data):
        pt.begin_step(step)                 # the map in effect at this step; weights follow it
        loss = model(batch).loss
        loss.backward()
        pt.end_step(step, loss=loss.item()) # report every block's gradient statistics
        optimizer.step()
        optimizer.zero_grad()
        if pt.calibration_wanted():
            pt.calibrate(lambda: model(next(calib_batches)))

What each call does:
  begin_step  reads the hint table once (prism.Client.begin_step, no system call after it) and
              applies each block's precision to its weights. A block at a low precision goes
              through Prism's block transfer (prism.Transfer): its parameters, one after the other
              in BF16, are a host block that is quantized in that format and fetched back as BF16,
              and the parameters take those values. On a CUDA model that is the real transfer
              (codes and scales copied host to device on the engine's streams, dequantized on the
              GPU, torch's stream made to wait for it without the host waiting); on the CPU the
              same engine dequantizes in host memory, which is fake quantization with exactly the
              values a quantized transfer delivers. A block at bf16 keeps its weights unchanged.
              Cost: each low block's weights cross to host memory once per step (they change at
              every optimizer step), a device-to-host copy on a GPU.
  end_step    computes each block's gradient statistics with Prism's kernels where the gradients
              are and sends one StepReport, then puts the full-precision weights back, so the
              optimizer updates them (the gradient of the quantized weights is applied to the
              full-precision ones: a straight-through estimate). CUDA gradients: the statistics
              are queued on torch's current stream and the report goes out from a later call
              once the GPU got there (prism_client_report_step_cuda), so the step never waits.
  calibrate   runs `samples` forward passes (the job's calibration_samples by default) with hooks
              that keep each block's real inputs, then measures each block's
              ||out_bf16 - out_low|| / ||out_bf16|| with its weights in BF16 and in a low format,
              averages over the samples, and sends the errors (DESIGN 4.5): in every format
              prismd still wants (under low_precision "auto", each of low_formats), on the same
              inputs. The weights go through the transfer under the job's scale mode, whose
              fractions of saturated and flushed elements end_step reports for the low blocks.

Hybrid devices (DESIGN 11, QSync): keyword arguments of attach, all optional.
  profile_forward  a callable running one forward pass of a training step's batch; attach runs it
              once (under torch.no_grad, before registering) with the forward of every nn.Linear
              inside each block wrapped to count its calls (input by position or as `input=`),
              to measure the block's forward FLOPs per step (2 * in_features * out_features per
              input row of every Linear call; other modules count 0) and its activation bytes
              (the BF16 bytes of every Linear input, which a high Linear keeps for backward:
              2 * numel). They go to prismd in the layout (flops, activation_bytes_bf16) for the
              hybrid planner.
  block_costs  [{flops, activation_bytes_bf16, state_bytes}, ...], one dict per block: the
              figures given instead of measured (a key left out keeps its measured or default
              value).
  optimizer_state_bytes_per_param  (default 8: Adam's two FP32 moments) for the default
              state_bytes of a block: the sum over its parameters of numel * (2 * the bytes of its
              dtype (weights and gradients) + optimizer_state_bytes_per_param).
  tensor_stats_every  N (default 0: off). On steps with step % N == 0 a forward pre-hook on each
              block takes its first floating-point positional input at the block's first call in
              the step (||X||_2, max|X| by Prism's statistics kernel, non-finite elements left
              out, and numel) and a forward hook its output's numel; at end_step the block's
              weights (every parameter, full precision) give ||W||_2, max|W| and numel. They are
              staged (prism.Client.stage_tensor_stats) for the report. On the CPU they go with that
              step's report; for CUDA tensors the kernels run on torch's stream and the figures
              are read back once the GPU got there (a CUDA event, never waited for), so they go
              with a later report. Needs a libprism with compute plans (ignored otherwise).
Compute plans: at begin_step the compute plan that came with the map in use (so every rank
switches at the map's effective step) says which blocks run low (prism.Client.
compute_precisions); it is read at every begin_step, not only when the map version changes, so a
plan the client reads again for the same map (its file mapped late, the layout registered after a
begin_step) is applied too. In the blocks planned low every nn.Linear called through its forward
(input by position or as `input=`) runs low_linear, an autograd Function:
  forward   F.linear(dequant(Qx), dequant(Qw), b): Qx the input quantized per tensor and Qw the
            weight per row to the plan's low format by Prism's kernels (low_input and low_weight
            give those values: the ones a low-precision matmul sees), the bias unchanged, under
            the caller's torch.autocast state.
  saves     the input's codes (uint8, one byte per element for int8 and fp8) and its scale (one
            float32), the weight parameter itself (no copy: the model keeps it anyway) and the
            autocast state (device type, enabled, dtype); not x, not a float copy of it. So a low
            Linear's saved activation is half the bytes of a BF16 input and a quarter of an FP32
            one (plus the 4 bytes of the scale): the A_i * 8 / 16 of the planner's memory model. Without a weight gradient wanted
            no codes are kept.
  backward  in the autocast state recorded by forward (whatever the caller's is then), with
            g = grad_y as rows [R, out]: grad_x = g @ W (the full-precision weight), grad_W =
            g^T @ dequant(Qx) (the input values forward used), grad_b = the sum of g's rows, each
            cast to its input's dtype. No forward matmul is recomputed. These are straight-through
            gradients, not the high op's (grad_W sees the quantized input).
  Both backward matmuls run in the high format (the model's dtype, or autocast's) for int8 and
  for fp8 alike: for int8 that is the planner's time model; for fp8 the model costs backward at
  fp8 throughput, which needs real FP8 matmuls (GPU kernels), not these.
Blocks planned high run unchanged. counters() adds compute_low_blocks (the ids running low now),
compute_low_block_steps (block-steps run low since attach) and plan_map_version (the map the plan
in use came with; 0: none).

DistributedDataParallel: QuantizedAllReduceState and quantized_allreduce_hook (python/prism/ddp.py,
re-exported here) all-reduce gradient buckets with Prism's quantized all-reduce (DESIGN 10), in a
fixed wire format or each block's format in an Attachment's map, and count the wire bytes.

Nothing here raises because the agent or prismd is missing: reports are dropped and counted
(`counters()`), and the weights keep the last map.
"""

import contextlib
import ctypes
import functools
import math
import warnings

import torch
import torch.nn.functional as F

from . import _lib, kernels
from .client import PRECISIONS, Client
from .transfer import SCALE_MODES, Transfer

_LOW = ("int8", "fp8_e4m3", "fp8_e5m2", "int4")


def _param_list(block):
    return [p for p in block.parameters() if p is not None]


def _flat_bf16(tensors):
    return torch.cat([t.detach().reshape(-1).to(torch.bfloat16) for t in tensors])


def fake_quantize(w, fmt, granularity="block", block=128):
    """w quantized to fmt and back, in w's dtype and shape: the values the block's weights have
    when they travel in fmt. Works on CPU tensors and, with a CUDA libprism, CUDA tensors."""
    flat = w.detach().contiguous().reshape(-1)
    src = flat if flat.dtype in (torch.float32, torch.bfloat16, torch.float16) else flat.float()
    codes, scales = kernels.quantize(src, fmt, granularity, block)
    out = kernels.dequantize(codes, scales, fmt, numel=src.numel(), granularity=granularity, block=block,
                             dtype="float32")
    return out.to(w.dtype).reshape(w.shape)


def _quantized(t, fmt, granularity):
    """t quantized to fmt by Prism's kernels (granularity "tensor" or "row": one scale per row of
    t.shape[-1] elements): (codes, scales, spec, dtype), codes uint8 (1 byte per element for int8
    and fp8; int4 two per byte), scales float32 (one per group), the kernel's spec, and the dtype
    the kernel read t in (t's, or float32 for a dtype the kernels do not take). Nothing is read
    back from a GPU (no NaN/Inf count), so a CUDA forward pass never waits here."""
    src = t.detach().contiguous()
    if src.dtype not in (torch.float32, torch.bfloat16, torch.float16):
        src = src.float()
    spec = kernels._spec(fmt, granularity, 128, None, default_row=src.shape[-1] if src.dim() and src.shape[-1] else 1)
    if src.numel() == 0:
        return (torch.empty(0, dtype=torch.uint8, device=src.device),
                torch.empty(0, dtype=torch.float32, device=src.device), spec, src.dtype)
    lay = kernels._layout(spec, src.numel())
    codes = torch.empty(lay.code_bytes, dtype=torch.uint8, device=src.device)
    scales = torch.empty(lay.groups, dtype=torch.float32, device=src.device)
    x = kernels._arg(src, "x", "float")
    tensor = x.tensor()
    if src.is_cuda:
        kernels._cuda_call("prism_quantize_cuda", src.device, ctypes.byref(spec), ctypes.byref(tensor),
                           codes.data_ptr(), scales.data_ptr(), None)
    else:
        kernels._host_call(_lib.load().prism_quantize_cpu, ctypes.byref(spec), ctypes.byref(tensor),
                           codes.data_ptr(), scales.data_ptr(), None)
    return codes, scales, spec, src.dtype


def _decoded(codes, scales, spec, shape, dtype):
    """The values codes and scales (from _quantized) stand for, dequantized by Prism's kernels into
    a new tensor of `shape` and `dtype` (the dtype _quantized read in) on the codes' device."""
    out = torch.empty(shape, dtype=dtype, device=codes.device)
    if out.numel() == 0:
        return out
    dt = kernels.DTYPES[str(dtype).replace("torch.", "")]
    if codes.is_cuda:
        kernels._cuda_call("prism_dequantize_cuda", codes.device, ctypes.byref(spec), codes.data_ptr(),
                           scales.data_ptr(), out.numel(), out.data_ptr(), dt)
    else:
        kernels._host_call(_lib.load().prism_dequantize_cpu, ctypes.byref(spec), codes.data_ptr(),
                           scales.data_ptr(), out.numel(), out.data_ptr(), dt)
    return out


def _dequantized(t, fmt, granularity):
    """t quantized to fmt and dequantized again by Prism's kernels (see _quantized), in t's dtype
    and shape: what kernels.quantize and kernels.dequantize give."""
    codes, scales, spec, dtype = _quantized(t, fmt, granularity)
    return _decoded(codes, scales, spec, t.shape, dtype).to(t.dtype)


def low_weight(w, fmt):
    """A Linear weight [out, in] as a low-precision matmul sees it: quantized per row (one scale
    per output feature) to fmt and dequantized, in w's dtype."""
    return _dequantized(w, fmt, "row")


def low_input(x, fmt):
    """A Linear input as a low-precision matmul sees it: quantized per tensor to fmt and
    dequantized, in x's dtype and shape."""
    return _dequantized(x, fmt, "tensor")


def _autocast_state(device_type):
    """(enabled, dtype) of torch.autocast for device_type on this thread, through the API of the
    installed torch (torch >= 2.4 takes the device type; older ones have per-device calls and
    autocast only for "cpu" and "cuda")."""
    try:
        return bool(torch.is_autocast_enabled(device_type)), torch.get_autocast_dtype(device_type)
    except (TypeError, AttributeError):
        pass
    if device_type == "cuda":
        return torch.is_autocast_enabled(), torch.get_autocast_gpu_dtype()
    if device_type == "cpu":
        return torch.is_autocast_cpu_enabled(), torch.get_autocast_cpu_dtype()
    return False, None


def _autocast_like(state):
    """A context manager that puts back the autocast state (device type, enabled, dtype) recorded
    by _LowLinear.forward; a no-op for a device type autocast does not know."""
    device_type, enabled, dtype = state
    if dtype is None:
        return contextlib.nullcontext()
    return torch.autocast(device_type=device_type, dtype=dtype, enabled=enabled)


class _LowLinear(torch.autograd.Function):
    """A Linear in the low format (the module's docstring says it all):
    forward  y = F.linear(dequant(Qx), dequant(Qw), b), Qx the input's codes (per tensor) and
             Qw the weight's (per row), under the autocast state of the caller;
    saves    Qx's codes (uint8, 1 byte per element for int8 and fp8) and scale, the weight
             parameter itself (no copy) and the autocast state; not x, not dequant(Qw);
    backward in the recorded autocast state, with g = grad_y as rows [R, out]:
             grad_x = g @ W (the full-precision weight), grad_W = g^T @ dequant(Qx) (the input
             values the forward used), grad_b = sum of g over the rows; each cast to its input's
             dtype. No forward matmul is recomputed."""

    @staticmethod
    def forward(ctx, x, w, b, fmt):
        dev = x.device.type
        ctx.autocast = (dev,) + tuple(_autocast_state(dev))
        codes, scales, spec, qdtype = _quantized(x, fmt, "tensor")
        xq = _decoded(codes, scales, spec, x.shape, qdtype).to(x.dtype)
        y = F.linear(xq, low_weight(w, fmt), b)
        del xq
        ctx.spec, ctx.qdtype, ctx.x_shape, ctx.x_dtype = spec, qdtype, x.shape, x.dtype
        ctx.b_dtype = b.dtype if b is not None else None
        if not ctx.needs_input_grad[1]:  # grad_W is the only use of the codes
            codes = scales = None
        ctx.save_for_backward(codes, scales, w)
        return y

    @staticmethod
    def backward(ctx, grad):
        codes, scales, w = ctx.saved_tensors
        need_x, need_w, need_b = ctx.needs_input_grad[:3]
        gx = gw = gb = None
        with _autocast_like(ctx.autocast):
            g = grad.reshape(-1, grad.shape[-1])
            if need_x:
                gx = torch.mm(g, w).reshape(ctx.x_shape).to(ctx.x_dtype)
            if need_w:
                xq = _decoded(codes, scales, ctx.spec, ctx.x_shape, ctx.qdtype).to(ctx.x_dtype)
                gw = torch.mm(g.t(), xq.reshape(-1, xq.shape[-1])).to(w.dtype)
            if need_b:
                gb = g.sum(0).to(ctx.b_dtype)
        return gx, gw, gb, None


def low_linear(x, weight, bias, fmt):
    """nn.Linear's forward in the low format fmt (see the module's docstring): what a Linear of a
    block planned low computes."""
    return _LowLinear.apply(x, weight, bias, fmt)


def _low_forward(module, fmt, input):
    """The forward a Linear of a block planned low gets (bound with functools.partial; takes its
    input by position or as nn.Linear's keyword `input`)."""
    return low_linear(input, module.weight, module.bias, fmt)


def _linears(block):
    return [m for m in block.modules() if isinstance(m, torch.nn.Linear)]


def _counted_forward(call, count, *args, **kwargs):
    """A Linear's forward `call` that first hands its input (the first positional argument, or
    nn.Linear's keyword `input`) to count."""
    count(args[0] if args else kwargs["input"])
    return call(*args, **kwargs)


def measure_costs(blocks, forward):
    """Runs forward() once under torch.no_grad with every nn.Linear inside each block counting
    its calls, and returns, per block, {"flops", "activation_bytes_bf16"}: 2 * in * out FLOPs per
    input row of each Linear call, and 2 bytes per element of each Linear input (other modules:
    0). The count wraps each Linear's forward for the call (so an input given by keyword,
    lin(input=x), counts too) and puts the forward back after."""
    costs = [{"flops": 0, "activation_bytes_bf16": 0} for _ in blocks]
    patched = []  # (linear, the instance's own forward before, or None)
    seen = set()
    try:
        for b, block in enumerate(blocks):
            for m in _linears(block):
                if id(m) in seen:  # a Linear shared by two blocks counts for the first
                    continue
                seen.add(id(m))

                def count(x, m=m, b=b):
                    rows = x.numel() // m.in_features if m.in_features else 0
                    costs[b]["flops"] += 2 * m.in_features * m.out_features * rows
                    costs[b]["activation_bytes_bf16"] += 2 * x.numel()
                call = m.forward
                patched.append((m, m.__dict__.get("forward")))
                m.forward = functools.partial(_counted_forward, call, count)
        with torch.no_grad():
            forward()
    finally:
        for m, before in reversed(patched):
            if before is None:
                del m.forward
            else:
                m.forward = before
    return costs


def default_state_bytes(params, optimizer_state_bytes_per_param=8):
    """Bytes of a block that no precision changes: numel * (2 * bytes per element (weights and
    gradients) + optimizer_state_bytes_per_param), summed over its parameters."""
    return sum(p.numel() * (2 * p.element_size() + optimizer_state_bytes_per_param) for p in params)


def _first_float(values):
    """The first floating-point tensor among values, or None."""
    for v in values:
        if torch.is_tensor(v) and v.is_floating_point():
            return v
    return None


def _stats_now(tensors):
    """(l2_norm, max_abs, numel) of host tensors, by prism_grad_stats_blocks_cpu."""
    st = kernels.grad_stats([_kernel_view(t) for t in tensors])
    return st["l2_norm"], st["max_abs"], st["numel"]


def _kernel_view(t):
    """t as the statistics kernel takes it: detached, contiguous, float32/bfloat16/float16."""
    t = t.detach()
    if t.dtype not in (torch.float32, torch.bfloat16, torch.float16):
        t = t.float()
    return t.contiguous()


def _stats_launch(blocks, out):
    """Queues prism_grad_stats_blocks_cuda for blocks (lists of CUDA tensors on one device) on
    torch's current stream, its results to `out` (a uint8 CUDA tensor of len(blocks) *
    sizeof(prism_grad_stats) bytes, possibly a view into a larger one); the tensors stay alive
    for the kernel through the stream order of torch's allocator."""
    device, tensors, block_start = kernels.block_tensors([[_kernel_view(t) for t in b] for b in blocks])
    kernels._cuda_call("prism_grad_stats_blocks_cuda", device, tensors, block_start, len(blocks), out.data_ptr())


_STATS_BYTES = ctypes.sizeof(_lib.GradStats)


def _finite_half(l2, max_abs, numel):
    """A half of a tensor-stats entry, or zeros (no figures) when one is not finite."""
    if numel and math.isfinite(l2) and math.isfinite(max_abs):
        return float(l2), float(max_abs), int(numel)
    return 0.0, 0.0, 0


class Attachment:
    """A model's blocks attached to Prism through one prism.Client."""

    def __init__(self, blocks, *, job_id=None, rank=0, world_size=1, dir=None, model_id="model", names=None,
                 low_precision="int8", granularity="block", block_size=128, client=None,
                 reconnect_interval_ms=0, profile_forward=None, block_costs=None,
                 optimizer_state_bytes_per_param=8, tensor_stats_every=0):
        self.blocks = list(blocks)
        if not self.blocks:
            raise ValueError("attach: the model has no blocks")
        if names is None:
            names = [f"blocks.{i}" for i in range(len(self.blocks))]
        if len(names) != len(self.blocks):
            raise ValueError(f"attach: {len(names)} names for {len(self.blocks)} blocks")
        self.names = list(names)
        self.granularity = granularity
        self.block_size = block_size
        self.low_precision = low_precision
        self.params = [_param_list(b) for b in self.blocks]
        devices = {p.device for ps in self.params for p in ps}
        if len(devices) > 1:
            raise ValueError(f"attach: the blocks' parameters are on several devices: {sorted(map(str, devices))}")
        self.device = devices.pop() if devices else torch.device("cpu")
        if block_costs is not None and len(block_costs) != len(self.blocks):
            raise ValueError(f"attach: {len(block_costs)} block_costs for {len(self.blocks)} blocks")
        if isinstance(tensor_stats_every, bool) or not isinstance(tensor_stats_every, int) or tensor_stats_every < 0:
            raise ValueError(f"attach: tensor_stats_every: {tensor_stats_every!r} is not an integer >= 0")
        self.costs = self._costs(profile_forward, block_costs, optimizer_state_bytes_per_param)
        layout = [dict(name=self.names[i], shapes=[tuple(p.shape) for p in ps],
                       param_bytes_bf16=2 * sum(p.numel() for p in ps), **self.costs[i])
                  for i, ps in enumerate(self.params)]
        self.client = client or Client(job_id=job_id, rank=rank, world_size=world_size, dir=dir,
                                       reconnect_interval_ms=reconnect_interval_ms)
        self.fingerprint = self.client.register(model_id, layout, low_precision, granularity, block_size)
        self.has_plans = self.client.has_plans()
        # Compute plans: the blocks running low now ({block: format}) and the Linears patched for it.
        self.compute_low = {}
        self.compute_low_block_steps = 0
        self.plan_map_version = 0
        self._patched = {}  # block -> [(linear, the instance's own forward before, or None)]
        # Tensor statistics (tensor_stats_every): this step's figures, and CUDA ones on their way.
        self.tensor_stats_every = tensor_stats_every if self.has_plans else 0
        self._sampling = False
        self._x = {}  # block -> (l2, max_abs, numel), or a slot index of the CUDA buffer
        self._y = {}  # block -> output numel
        self._stats_buf = None
        self._pending = []  # [(cuda event, pinned host bytes, x blocks, y numels, w numels)]
        self.staged_tensor_stats = None  # the entries last staged
        self._stats_hooks = []
        if self.tensor_stats_every:
            for b, block in enumerate(self.blocks):
                self._stats_hooks.append(block.register_forward_pre_hook(functools.partial(self._take_input, b)))
                self._stats_hooks.append(block.register_forward_hook(functools.partial(self._take_output, b)))
        # Each block's weights as one BF16 block in a transfer engine (host memory; pinned on CUDA),
        # and the destination its fetches land in (on the model's device).
        numels = [sum(p.numel() for p in ps) for ps in self.params]
        self.transfer = Transfer("cpu" if self.device.type == "cpu" else self.device,
                                 max_block_bytes=2 * max(max(numels), 1), granularity=granularity, block=block_size)
        self._dst = {}
        for b, ps in enumerate(self.params):
            if numels[b]:
                self.transfer.add_block(b, _flat_bf16(ps).cpu())
                self._dst[b] = torch.empty(numels[b], dtype=torch.bfloat16, device=self.device)
        self.applied = ["bf16"] * len(self.blocks)  # the precision each block's weights have now
        self._scale_mode = ("current", 16, 0)  # the transfer's (scale_mode, amax_history_len, scale_margin)
        self._unknown_mode = None  # the last unknown scale mode warned about
        self.map_version = 0
        self.switches = []  # (step, map_version, precisions) each time the map in use changed
        self.late_switches = 0  # maps first used after a step at or past their effective step
        self._masters = {}  # block -> full-precision copies of its weights while they are quantized
        self._step = None

    def _costs(self, profile_forward, block_costs, osb):
        """Each block's {flops, activation_bytes_bf16, state_bytes} for the layout."""
        measured = (measure_costs(self.blocks, profile_forward) if profile_forward is not None
                    else [{"flops": 0, "activation_bytes_bf16": 0} for _ in self.blocks])
        out = []
        for b, ps in enumerate(self.params):
            c = dict(measured[b], state_bytes=default_state_bytes(ps, osb))
            given = block_costs[b] if block_costs is not None else {}
            unknown = sorted(set(given) - set(c))
            if unknown:
                raise ValueError(f"attach: block_costs[{b}]: unknown key {unknown[0]!r} (known: flops, "
                                 "activation_bytes_bf16, state_bytes)")
            c.update({k: int(v) for k, v in given.items()})
            out.append(c)
        return out

    # ---- the map ----

    def begin_step(self, step):
        """Takes the map in effect at `step` and applies it to the weights, and its compute plan to
        the blocks' Linears; returns its version. The job's scale mode (scale_mode,
        amax_history_len, scale_margin) is the transfer's from the step it is seen at."""
        version = self.client.begin_step(step)
        self._follow_scale_mode()
        precisions = self.client.precisions()
        if version != self.map_version:
            # Late: an earlier step already at or past this map's effective step ran on the old one.
            if self._step is not None and self._step >= self.client.state()["effective_step"]:
                self.late_switches += 1
            self.switches.append((step, version, list(precisions)))
            self.map_version = version
        self._step = step
        quantized = False
        for b, p in enumerate(precisions):
            if p in _LOW and b in self._dst:
                self._quantize_block(b, p)
                quantized = True
        if quantized:
            _weights_changed()
        self._apply_plan()
        self._collect_stats()
        self._sampling = bool(self.tensor_stats_every) and step % self.tensor_stats_every == 0
        self._x, self._y = {}, {}
        return version

    def _follow_scale_mode(self):
        """Gives the transfer engine the job's scale mode when it changed (a Welcome or a
        ConfigUpdate wrote it into the hint table): the images are made again under it."""
        s = self.client.state()
        if "scale_mode" not in s or not s.get("upstream_connected"):
            return  # a table not yet published (agent starting again) shows defaults: keep ours
        mode = (s["scale_mode"], s["amax_history_len"], s["scale_margin"])
        if mode == self._scale_mode:
            return
        if mode[0] not in SCALE_MODES:
            if mode != self._unknown_mode:
                self._unknown_mode = mode
                warnings.warn(f"prism: the job's scale_mode {mode[0]!r} is unknown to this prism.torch; "
                              f"keeping {self._scale_mode[0]!r}", RuntimeWarning, stacklevel=3)
            return
        self.transfer.set_scale_mode(*mode)
        self._scale_mode = mode

    # ---- compute plans ----

    def _apply_plan(self):
        """Patches the Linears of the blocks the plan in use puts low, unpatches the others. The
        plan is read at every begin_step (a copy in the client, no system call), not only when
        the map version changes: the client may read the plan of the same map again (the plan
        file mapped after the map was taken, or the layout registered after a begin_step), and
        the Linears follow whatever it holds now."""
        if not self.has_plans:
            return
        low = {b: p for b, p in enumerate(self.client.compute_precisions()) if p != "bf16"}
        if low != self.compute_low:
            self._set_compute(low)
        plan = self.client.plan()
        self.plan_map_version = plan["map_version"] if plan else 0
        self.compute_low_block_steps += len(self.compute_low)

    def _set_compute(self, low):
        """Makes exactly the blocks of `low` ({block: format}) run their Linears low: a block that
        leaves it (or changes format) gets each Linear's own forward back (the instance's, if it
        had one, else the class's); a block that enters it gets low_forward in its Linears."""
        for b in [b for b in self._patched if self.compute_low.get(b) != low.get(b)]:
            for m, before in self._patched.pop(b):
                if before is None:
                    del m.forward
                else:
                    m.forward = before
        for b, fmt in low.items():
            if b not in self._patched and b < len(self.blocks):
                self._patched[b] = []
                for m in _linears(self.blocks[b]):
                    self._patched[b].append((m, m.__dict__.get("forward")))
                    m.forward = functools.partial(_low_forward, m, fmt)
        self.compute_low = dict(low)

    def compute_low_blocks(self):
        """The ids of the blocks whose Linears run in the low format now, ascending."""
        return sorted(self.compute_low)

    # ---- tensor statistics ----

    def _stats_slots(self, device):
        """The CUDA buffer of this step's figures: slot b for block b's input, n + b its weights."""
        n = len(self.blocks)
        if self._stats_buf is None or self._stats_buf.device != device:
            self._stats_buf = torch.empty(2 * n * _STATS_BYTES, dtype=torch.uint8, device=device)
        return self._stats_buf

    def _take_input(self, b, module, args):
        if not self._sampling or b in self._x:
            return
        x = _first_float(args)
        if x is None:
            return
        if x.is_cuda:
            buf = self._stats_slots(x.device)
            _stats_launch([[x]], buf[b * _STATS_BYTES:(b + 1) * _STATS_BYTES])
            self._x[b] = b
        else:
            self._x[b] = _stats_now([x])

    def _take_output(self, b, module, args, output):
        if self._sampling and b not in self._y:
            y = _first_float(output if isinstance(output, (tuple, list)) else [output])
            if y is not None:
                self._y[b] = y.numel()

    def _weight_stats(self):
        """Stages this step's figures (weights now, inputs from the hooks) or, for CUDA tensors,
        queues them to be read back once the GPU got there."""
        n = len(self.blocks)
        w_numel = [sum(p.numel() for p in ps) for ps in self.params]
        if self.device.type == "cuda":
            buf = self._stats_slots(self.device)
            with torch.cuda.device(self.device):  # the copy and the event on that device's current stream
                _stats_launch([list(ps) for ps in self.params], buf[n * _STATS_BYTES:])
                host = torch.empty(buf.numel(), dtype=torch.uint8, pin_memory=True)
                host.copy_(buf, non_blocking=True)
                event = torch.cuda.Event()
                event.record()
            self._pending.append((event, host, dict(self._x), dict(self._y), w_numel))
            self._stats_buf = None  # the next step writes a new one
            self._collect_stats()
            return
        w = [_stats_now(ps) if ps else (0.0, 0.0, 0) for ps in self.params]
        self._stage(self._entries(lambda b: self._x[b], self._x, self._y, w))

    def _collect_stats(self):
        """Stages the CUDA figures the GPU has finished (the latest of them), without waiting."""
        done = None
        while self._pending and self._pending[0][0].query():
            done = self._pending.pop(0)
        if done is None:
            return
        _, host, xs, ys, w_numel = done
        n = len(self.blocks)
        raw = (_lib.GradStats * (2 * n)).from_buffer_copy(host.numpy().tobytes())

        def half(i, numel=None):
            st = raw[i]
            return st.l2_norm, st.max_abs, int(st.numel) if numel is None else numel
        w = [half(n + b, w_numel[b]) for b in range(n)]
        self._stage(self._entries(lambda b: half(xs[b]), xs, ys, w))

    def _entries(self, x_of, xs, ys, w):
        """One stage_tensor_stats entry per block: the input half from x_of(b) for the blocks in xs
        (others: none), the weight half from w[b], the output numel from ys; a half with a
        non-finite figure is left out (numel 0) rather than refused."""
        out = []
        for b in range(len(self.blocks)):
            x_l2, x_max, x_n = _finite_half(*x_of(b)) if b in xs else (0.0, 0.0, 0)
            w_l2, w_max, w_n = _finite_half(*w[b])
            out.append({"block_id": b, "x_l2": x_l2, "x_max_abs": x_max, "x_numel": x_n, "w_l2": w_l2,
                        "w_max_abs": w_max, "w_numel": w_n, "y_numel": ys.get(b, 0)})
        return out

    def _stage(self, entries):
        """Hands the entries to the client for its next report, and keeps them (staged_tensor_stats)."""
        self.client.stage_tensor_stats(entries)
        self.staged_tensor_stats = entries

    def precisions(self):
        """Each block's precision in the map taken by the last begin_step."""
        return self.client.precisions()

    def _low_weights(self, b, fmt, masters):
        """The block's weights as a transfer in fmt delivers them: the block in BF16 (its
        parameters one after the other), quantized and dequantized by the transfer engine, back
        in each parameter's dtype and shape."""
        self.transfer.update_block(b, _flat_bf16(masters).cpu())
        dst = self._dst[b]
        ticket = self.transfer.fetch(b, fmt, dst)
        if dst.is_cuda:
            self.transfer.wait_stream(ticket)  # later work on torch's stream waits; the host does not
        out, at = [], 0
        for m in masters:
            n = m.numel()
            out.append(dst[at:at + n].view(m.shape).to(m.dtype))
            at += n
        return out

    def _quantize_block(self, b, fmt):
        with torch.no_grad():
            masters = self._masters.get(b)
            if masters is None:
                masters = [p.detach().clone() for p in self.params[b]]
                self._masters[b] = masters
            for p, w in zip(self.params[b], self._low_weights(b, fmt, masters)):
                p.copy_(w)
        self.applied[b] = fmt  # the caller calls _weights_changed once for all its blocks

    def _restore_weights(self):
        with torch.no_grad():
            for b, masters in self._masters.items():
                for p, m in zip(self.params[b], masters):
                    p.copy_(m)
        _weights_changed()
        self._masters.clear()
        self.applied = ["bf16"] * len(self.blocks)

    # ---- reports ----

    def end_step(self, step=None, loss=None):
        """After backward, before the optimizer: reports every block's gradient statistics and
        gives the optimizer the full-precision weights back. Returns False when the report was
        dropped (no agent, or the agent is behind), True when it went out or is on its way."""
        step = self._step if step is None else step
        grads = [[p.grad for p in ps if p.grad is not None] for ps in self.params]
        fractions = self._fractions()
        self._restore_weights()
        if step is None:
            raise ValueError("end_step: no step given and begin_step was never called")
        if self._sampling:
            self._sampling = False
            self._weight_stats()
        elif self._pending:
            self._collect_stats()
        # fractions only when some block has them: a client written for the older report_step
        # works on while no block is low
        extra = {"fractions": fractions} if fractions is not None else {}
        return self.client.report_step(step, [[g.detach().contiguous() for g in block] for block in grads],
                                       loss=loss, **extra)

    def _fractions(self):
        """Each block's (saturated, underflowed) fractions of this step: what the transfer's
        prepare of the weights it ran with clipped and flushed to zero (prism.Transfer
        block_counts), for the blocks low this step; None for the others. None when no block is
        low."""
        out = [None] * len(self.blocks)
        for b, fmt in enumerate(self.applied):
            if fmt in _LOW and b in self._dst:
                c = self.transfer.block_counts(b, fmt)
                if c["numel"]:
                    out[b] = (c["saturated"] / c["numel"], c["underflowed"] / c["numel"])
        return out if any(f is not None for f in out) else None

    # ---- calibration ----

    def calibration_wanted(self):
        """True when prismd asked for calibration (no cached errors for this fingerprint) and the
        job's config allows running it."""
        s = self.client.state()
        return s["calibration_needed"] and s["run_calibration"]

    def calibrate(self, forward, samples=None, fmt=None):
        """Runs forward() `samples` times (default: the job's calibration_samples, at least 1),
        keeping each block's inputs, then measures each block's relative output error in a low
        format against BF16 weights on those inputs and reports it (DESIGN 4.5).
        fmt given: that format; returns {block: error}.
        fmt None: every format prismd wants calibrated (the state's calibration_formats; when it
        lists none, every format of low_formats under "auto", else the job's low precision), all
        on the same captured inputs, each reported; returns {format: {block: error}}.
        The low weights come through the transfer under the job's scale mode, as training's do:
        under "delayed" the calibrated weights are one more version in each block's amax history
        (the same weights as the step's), and each block's last counts are the calibration's
        until its next prepare, so call it outside begin_step / end_step."""
        state = self.client.state()
        samples = samples or state["calibration_samples"] or 1
        if fmt:
            formats = [fmt]
        else:
            formats = list(state.get("calibration_formats") or [])
            if not formats:
                formats = (list(state.get("low_formats") or ["int8"]) if state["low_precision"] == "auto"
                           else [state["low_precision"]])
        for f in formats:
            if f not in _LOW:
                raise ValueError(f"calibrate: {f!r} is not a low precision ({', '.join(_LOW)})")
        captured = [[] for _ in self.blocks]
        compute_low, sampling = dict(self.compute_low), self._sampling
        self._set_compute({})  # the reference and the low outputs are the weights' alone
        self._sampling = False
        try:
            self._capture(forward, samples, captured)
            out = {}
            for f in formats:
                out[f] = self._measure(f, captured)
                self.client.report_calibration(f, samples, out[f])
            return out[fmt] if fmt else out
        finally:
            self._set_compute(compute_low)
            self._sampling = sampling

    def _capture(self, forward, samples, captured):
        """Runs forward() `samples` times with hooks keeping each block's positional inputs."""
        hooks = []
        for b, block in enumerate(self.blocks):
            def keep(module, args, b=b):  # positional inputs (torch 1.13 hooks see no keywords)
                captured[b].append(tuple(a.detach() if torch.is_tensor(a) else a for a in args))
            hooks.append(block.register_forward_pre_hook(keep))
        try:
            with torch.no_grad():
                for _ in range(samples):
                    forward()
        finally:
            for h in hooks:
                h.remove()

    def _measure(self, fmt, captured):
        """{block: mean relative output error in fmt} over the captured inputs (compute plan and
        tensor statistics hooks off)."""
        errors = {}
        with torch.no_grad():
            for b, block in enumerate(self.blocks):
                if not captured[b]:
                    continue
                originals = [p.detach().clone() for p in self.params[b]]
                low_weights = self._low_weights(b, fmt, originals) if b in self._dst else originals
                total = 0.0
                for args in captured[b]:
                    for p, o in zip(self.params[b], originals):
                        p.copy_(o.to(torch.bfloat16).to(o.dtype))
                    _weights_changed()
                    ref = _first_tensor(block(*args))
                    for p, w in zip(self.params[b], low_weights):
                        p.copy_(w)
                    _weights_changed()
                    low = _first_tensor(block(*args))
                    total += kernels.relative_error(ref.float().contiguous().reshape(-1),
                                                    low.float().contiguous().reshape(-1))
                for p, o in zip(self.params[b], originals):
                    p.copy_(o)
                _weights_changed()
                errors[b] = total / len(captured[b])
        return errors

    # ---- the rest ----

    def counters(self):
        """The client's counters (reports sent, dropped, ...), with the compute plan's:
        compute_low_blocks (ids running low now), compute_low_block_steps, plan_map_version."""
        out = self.client.counters()
        out.update(compute_low_blocks=self.compute_low_blocks(), compute_low_block_steps=self.compute_low_block_steps,
                   plan_map_version=self.plan_map_version)
        return out

    def transfer_counters(self):
        """The transfer engine's counters (fetches and bytes per precision, ...)."""
        return self.transfer.counters()

    def close(self):
        self._set_compute({})
        for h in self._stats_hooks:
            h.remove()
        self._stats_hooks = []
        self._restore_weights()
        self.client.close()
        self.transfer.close()


def _weights_changed():
    """Called after parameters were overwritten in place. Inside torch.autocast, a parameter's
    cast to the lower precision is cached until the outermost autocast region ends, and a forward
    pass in the same region would keep using the cast of the weights as they were: calibrate's
    reference and low weights would both be the cast of the captured pass's weights (only
    parameters autocast does not cast, such as LayerNorm's, would differ), and a map applied inside
    a region would not reach the Linears. Dropping the cache makes the next cast see the weights
    as they are now."""
    if torch.is_autocast_enabled() or torch.is_autocast_cpu_enabled():
        torch.clear_autocast_cache()


def _first_tensor(out):
    if torch.is_tensor(out):
        return out
    if isinstance(out, (tuple, list)) and out and torch.is_tensor(out[0]):
        return out[0]
    raise TypeError("calibrate: a block's forward must return a tensor (or a tuple starting with one)")


def attach(blocks, **kwargs):
    """Attaches Prism to a model's list of blocks (an nn.ModuleList, or any list of modules); see
    Attachment for the keyword arguments (job_id, rank, world_size, dir, model_id, names,
    low_precision, granularity, block_size; profile_forward, block_costs,
    optimizer_state_bytes_per_param, tensor_stats_every: the module's docstring)."""
    return Attachment(blocks, **kwargs)


# The DDP communication hook (DESIGN 10 inside PyTorch): python/prism/ddp.py.
from .ddp import QuantizedAllReduceState, quantized_allreduce, quantized_allreduce_hook  # noqa: E402

__all__ = ["Attachment", "QuantizedAllReduceState", "attach", "default_state_bytes", "fake_quantize", "low_input",
           "low_linear", "low_weight", "measure_costs", "PRECISIONS", "quantized_allreduce", "quantized_allreduce_hook"]
