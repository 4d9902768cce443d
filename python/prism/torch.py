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
              ||out_bf16 - out_low|| / ||out_bf16|| with its weights in BF16 and in the low format,
              averages over the samples, and sends the errors (DESIGN 4.5).

Nothing here raises because the agent or prismd is missing: reports are dropped and counted
(`counters()`), and the weights keep the last map.
"""

import torch

from . import kernels
from .client import PRECISIONS, Client
from .transfer import Transfer

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
        devices = {p.device for ps in self.params for p in ps}
        if len(devices) > 1:
            raise ValueError(f"attach: the blocks' parameters are on several devices: {sorted(map(str, devices))}")
        self.device = devices.pop() if devices else torch.device("cpu")
        layout = [(self.names[i], [tuple(p.shape) for p in ps], 2 * sum(p.numel() for p in ps))
                  for i, ps in enumerate(self.params)]
        self.client = client or Client(job_id=job_id, rank=rank, world_size=world_size, dir=dir,
                                       reconnect_interval_ms=reconnect_interval_ms)
        self.fingerprint = self.client.register(model_id, layout, low_precision, granularity, block_size)
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
        self.map_version = 0
        self.switches = []  # (step, map_version, precisions) each time the map in use changed
        self.late_switches = 0  # maps first used after a step at or past their effective step
        self._masters = {}  # block -> full-precision copies of its weights while they are quantized
        self._step = None

    # ---- the map ----

    def begin_step(self, step):
        """Takes the map in effect at `step` and applies it to the weights; returns its version."""
        version = self.client.begin_step(step)
        precisions = self.client.precisions()
        if version != self.map_version:
            # Late: an earlier step already at or past this map's effective step ran on the old one.
            if self._step is not None and self._step >= self.client.state()["effective_step"]:
                self.late_switches += 1
            self.switches.append((step, version, list(precisions)))
            self.map_version = version
        self._step = step
        for b, p in enumerate(precisions):
            if p in _LOW and b in self._dst:
                self._quantize_block(b, p)
        return version

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
                low_weights = self._low_weights(b, fmt, originals) if b in self._dst else originals
                total = 0.0
                for args in captured[b]:
                    for p, o in zip(self.params[b], originals):
                        p.copy_(o.to(torch.bfloat16).to(o.dtype))
                    ref = _first_tensor(block(*args))
                    for p, w in zip(self.params[b], low_weights):
                        p.copy_(w)
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
        """The client's counters (reports sent, dropped, ...)."""
        return self.client.counters()

    def transfer_counters(self):
        """The transfer engine's counters (fetches and bytes per precision, ...)."""
        return self.transfer.counters()

    def close(self):
        self._restore_weights()
        self.client.close()
        self.transfer.close()


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
