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
              applies each block's precision to its weights: a block at a low precision gets its
              weights quantized and dequantized in that format (fake quantization, so the forward
              and backward passes see exactly the values a quantized transfer would deliver); a
              block at bf16 uses its weights unchanged.
  end_step    computes each block's gradient statistics with Prism's kernels where the gradients
              are and sends one StepReport, then puts the full-precision weights back, so the
              optimizer updates them (the gradient of the quantized weights is applied to the
              full-precision ones: a straight-through estimate). CUDA gradients: the statistics
              are queued on torch's current stream and the report goes out from a later call
              once the GPU got there (prism_client_report_step_cuda), so the step never waits.
  calibrate   runs `samples` forward passes (the job's calibration_samples by default) with hooks
              that keep each block's real inputs, then measures each block's
              ||out_bf16 - out_low|| / ||out_bf16|| with its weights in BF16 and in the low format,
              averages over the samples, and sends the errors (DESIGN 4.5).

Nothing here raises because the agent or prismd is missing: reports are dropped and counted
(`counters()`), and the weights keep the last map.
"""

import torch

from . import kernels
from .client import PRECISIONS, Client

_LOW = ("int8", "fp8_e4m3", "fp8_e5m2", "int4")


def _param_list(block):
    return [p for p in block.parameters() if p is not None]


def fake_quantize(w, fmt, granularity="block", block=128):
    """w quantized to fmt and back, in w's dtype and shape: the values the block's weights have
    when they travel in fmt. Works on CPU tensors and, with a CUDA libprism, CUDA tensors."""
    flat = w.detach().contiguous().reshape(-1)
    src = flat if flat.dtype in (torch.float32, torch.bfloat16, torch.float16) else flat.float()
    codes, scales = kernels.quantize(src, fmt, granularity, block)
    out = kernels.dequantize(codes, scales, fmt, numel=src.numel(), granularity=granularity, block=block,
                             dtype="float32")
    return out.to(w.dtype).reshape(w.shape)


class Attachment:
    """A model's blocks attached to Prism through one prism.Client."""

    def __init__(self, blocks, *, job_id=None, rank=0, world_size=1, dir=None, model_id="model", names=None,
                 low_precision="int8", granularity="block", block_size=128, client=None,
                 reconnect_interval_ms=0):
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
        layout = [(self.names[i], [tuple(p.shape) for p in ps], 2 * sum(p.numel() for p in ps))
                  for i, ps in enumerate(self.params)]
        self.client = client or Client(job_id=job_id, rank=rank, world_size=world_size, dir=dir,
                                       reconnect_interval_ms=reconnect_interval_ms)
        self.fingerprint = self.client.register(model_id, layout, low_precision, granularity, block_size)
        self.applied = ["bf16"] * len(self.blocks)  # the precision each block's weights have now
        self.map_version = 0
        self.switches = []  # (step, map_version, precisions) each time the map in use changed
        self.late_switches = 0  # maps first seen after their effective step had begun
        self._masters = {}  # block -> full-precision copies of its weights while they are quantized
        self._step = None

    # ---- the map ----

    def begin_step(self, step):
        """Takes the map in effect at `step` and applies it to the weights; returns its version."""
        version = self.client.begin_step(step)
        precisions = self.client.precisions()
        if version != self.map_version:
            state = self.client.state()
            if state["effective_step"] < step and self.switches and version > self.map_version:
                self.late_switches += 1
            self.switches.append((step, version, list(precisions)))
            self.map_version = version
        self._step = step
        for b, p in enumerate(precisions):
            if p in _LOW:
                self._quantize_block(b, p)
        return version

    def precisions(self):
        """Each block's precision in the map taken by the last begin_step."""
        return self.client.precisions()

    def _quantize_block(self, b, fmt):
        with torch.no_grad():
            masters = self._masters.get(b)
            if masters is None:
                masters = [p.detach().clone() for p in self.params[b]]
                self._masters[b] = masters
            for p, m in zip(self.params[b], masters):
                p.copy_(fake_quantize(m, fmt, self.granularity, self.block_size))
        self.applied[b] = fmt

    def _restore_weights(self):
        with torch.no_grad():
            for b, masters in self._masters.items():
                for p, m in zip(self.params[b], masters):
                    p.copy_(m)
        self._masters.clear()
        self.applied = ["bf16"] * len(self.blocks)

    # ---- reports ----

    def end_step(self, step=None, loss=None):
        """After backward, before the optimizer: reports every block's gradient statistics and
        gives the optimizer the full-precision weights back. Returns False when the report was
        dropped (no agent, or the agent is behind), True when it went out or is on its way."""
        step = self._step if step is None else step
        grads = [[p.grad for p in ps if p.grad is not None] for ps in self.params]
        self._restore_weights()
        if step is None:
            raise ValueError("end_step: no step given and begin_step was never called")
        return self.client.report_step(step, [[g.detach().contiguous() for g in block] for block in grads],
                                       loss=loss)

    # ---- calibration ----

    def calibration_wanted(self):
        """True when prismd asked for calibration (no cached errors for this fingerprint) and the
        job's config allows running it."""
        s = self.client.state()
        return s["calibration_needed"] and s["run_calibration"]

    def calibrate(self, forward, samples=None, fmt=None):
        """Runs forward() `samples` times (default: the job's calibration_samples, at least 1),
        keeping each block's inputs, and reports each block's relative output error in fmt
        (default: the job's low precision) against BF16 weights. Returns {block: error}."""
        state = self.client.state()
        samples = samples or state["calibration_samples"] or 1
        fmt = fmt or state["low_precision"]
        if fmt not in _LOW:
            raise ValueError(f"calibrate: {fmt!r} is not a low precision ({', '.join(_LOW)})")
        captured = [[] for _ in self.blocks]
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
        errors = {}
        with torch.no_grad():
            for b, block in enumerate(self.blocks):
                if not captured[b]:
                    continue
                originals = [p.detach().clone() for p in self.params[b]]
                total = 0.0
                for args in captured[b]:
                    for p, o in zip(self.params[b], originals):
                        p.copy_(o.to(torch.bfloat16).to(o.dtype))
                    ref = _first_tensor(block(*args))
                    for p, o in zip(self.params[b], originals):
                        p.copy_(fake_quantize(o, fmt, self.granularity, self.block_size))
                    low = _first_tensor(block(*args))
                    total += kernels.relative_error(ref.float().contiguous().reshape(-1),
                                                    low.float().contiguous().reshape(-1))
                for p, o in zip(self.params[b], originals):
                    p.copy_(o)
                errors[b] = total / len(captured[b])
        self.client.report_calibration(fmt, samples, errors)
        return errors

    # ---- the rest ----

    def counters(self):
        return self.client.counters()

    def close(self):
        self._restore_weights()
        self.client.close()


def _first_tensor(out):
    if torch.is_tensor(out):
        return out
    if isinstance(out, (tuple, list)) and out and torch.is_tensor(out[0]):
        return out[0]
    raise TypeError("calibrate: a block's forward must return a tensor (or a tuple starting with one)")


def attach(blocks, **kwargs):
    """Attaches Prism to a model's list of blocks (an nn.ModuleList, or any list of modules); see
    Attachment for the keyword arguments (job_id, rank, world_size, dir, model_id, names,
    low_precision, granularity, block_size)."""
    return Attachment(blocks, **kwargs)


__all__ = ["Attachment", "attach", "fake_quantize", "PRECISIONS"]
