#!/usr/bin/python3
"""prism.Transfer (python/prism/transfer.py) on libprism's block transfer: the CPU backend here,
the CUDA one where there is a device (torch's CUDA, or the CUDA runtime named by PRISM_CUDART, which
the emulated build sets to its emulated runtime; those cases skip without one). Pinned: a fetch in each low
precision gives exactly the kernels' quantize then dequantize of the block, a BF16 fetch the block
itself; wire bytes and counters are exact; bad arguments raise PrismInvalidError naming them."""

import ctypes
import os
import sys
import unittest

import numpy as np
import torch

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "..", "python"))

import prism  # noqa: E402

LOW = ("int8", "fp8_e4m3", "fp8_e5m2", "int4")


def weights(n, seed):
    g = torch.Generator().manual_seed(seed)
    return (torch.randn(n, generator=g) * torch.linspace(0.01, 4, n)).to(torch.bfloat16)


def expected(w, fmt):
    codes, scales = prism.quantize(w, fmt, "block", 128)
    return prism.dequantize(codes, scales, fmt, numel=w.numel(), granularity="block", block=128, dtype="bfloat16")


class TransferCpuTest(unittest.TestCase):
    def test_fetch_equals_quantize_then_dequantize(self):
        blocks = {0: weights(1000, 1), 7: weights(4096, 2)}
        t = prism.Transfer("cpu", max_block_bytes=2 * 4096)
        for b, w in blocks.items():
            t.add_block(b, w)
        for b, w in blocks.items():
            dst = torch.empty(w.numel(), dtype=torch.bfloat16)
            t.wait(t.fetch(b, "bf16", dst))
            self.assertTrue(torch.equal(dst.view(torch.int16), w.view(torch.int16)))
            for fmt in LOW:
                t.wait(t.fetch(b, fmt, dst))
                self.assertTrue(torch.equal(dst.view(torch.int16), expected(w, fmt).view(torch.int16)), (b, fmt))
        # 1000 elements: 8 groups of 128 -> 1000 code bytes padded to 1008, then 8 FP32 scales.
        self.assertEqual(t.wire_bytes(0, "int8"), 1008 + 32)
        self.assertEqual(t.wire_bytes(0, "int4"), 500 + 12 + 32)
        self.assertEqual(t.wire_bytes(0, "bf16"), 2000)
        c = t.counters()
        self.assertEqual(c["fetches"], {"bf16": 2, "int8": 2, "fp8_e4m3": 2, "fp8_e5m2": 2, "int4": 2})
        self.assertEqual(c["bf16_bytes"]["int8"], 2 * (1000 + 4096))
        self.assertEqual(c["prepares"], 8)

        # New weights: the next fetch uses them.
        w2 = weights(1000, 3)
        t.update_block(0, w2)
        dst = torch.empty(1000, dtype=torch.bfloat16)
        t.wait(t.fetch(0, "int8", dst))
        self.assertTrue(torch.equal(dst.view(torch.int16), expected(w2, "int8").view(torch.int16)))
        t.synchronize()
        t.close()

    def test_numpy_bits_are_weights_too(self):
        w = weights(256, 4)
        t = prism.Transfer("cpu", max_block_bytes=512)
        t.add_block(1, w.view(torch.int16).numpy().view(np.uint16))
        dst = torch.empty(256, dtype=torch.bfloat16)
        t.wait(t.fetch(1, "fp8_e5m2", dst))
        self.assertTrue(torch.equal(dst.view(torch.int16), expected(w, "fp8_e5m2").view(torch.int16)))

    def test_bad_arguments_are_named(self):
        t = prism.Transfer("cpu", max_block_bytes=512)
        t.add_block(0, weights(256, 5))
        dst = torch.empty(256, dtype=torch.bfloat16)
        cases = [
            (lambda: t.fetch(0, "int9", dst), "precision: 'int9' is not one of"),
            (lambda: t.fetch(0, "int8", torch.empty(256)), "dst: a contiguous torch.bfloat16 tensor"),
            (lambda: t.fetch(0, "int8", torch.empty(255, dtype=torch.bfloat16)), "dst: 255 elements, block 0 has 256"),
            (lambda: t.add_block(2, torch.empty(8)), "weights: BF16 weights in host memory"),
            (lambda: t.add_block(3, np.zeros(4, dtype=np.float32)), "weights: a NumPy array of BF16 bits must be uint16"),
            (lambda: prism.Transfer("tpu", max_block_bytes=2), "device: 'tpu' is not cpu or cuda"),
        ]
        for call, message in cases:
            with self.assertRaisesRegex(prism.PrismInvalidError, message.replace("(", r"\(")):
                call()
        with self.assertRaises(prism.PrismError) as e:
            t.add_block(4, weights(257, 6))
        self.assertEqual(e.exception.status, prism.Status.LIMIT)
        with self.assertRaises(prism.PrismError) as e:
            t.fetch(9, "int8", dst)
        self.assertEqual(e.exception.status, prism.Status.NOT_FOUND)


class DeviceArray:
    """n BF16 elements of device memory from the CUDA runtime at PRISM_CUDART (through ctypes), as
    a __cuda_array_interface__ array: how a process without torch's CUDA (the emulated build's
    tests, a CuPy user) hands prism.Transfer its destinations."""

    def __init__(self, rt, n):
        self.rt, self.n = rt, n
        self.ptr = ctypes.c_void_p()
        assert rt.cudaMalloc(ctypes.byref(self.ptr), ctypes.c_size_t(2 * n)) == 0
        self.__cuda_array_interface__ = {"shape": (n,), "typestr": "<u2", "data": (self.ptr.value, False),
                                         "version": 3}

    def to_host(self):
        out = torch.empty(self.n, dtype=torch.int16)
        assert self.rt.cudaDeviceSynchronize() == 0
        assert self.rt.cudaMemcpy(ctypes.c_void_p(out.data_ptr()), self.ptr, ctypes.c_size_t(2 * self.n), 2) == 0
        return out

    def free(self):
        assert self.rt.cudaFree(self.ptr) == 0


def cuda_runtime():
    path = os.environ.get("PRISM_CUDART")
    if not path:
        return None
    rt = ctypes.CDLL(path)
    rt.cudaMalloc.argtypes = [ctypes.POINTER(ctypes.c_void_p), ctypes.c_size_t]
    rt.cudaMemcpy.argtypes = [ctypes.c_void_p, ctypes.c_void_p, ctypes.c_size_t, ctypes.c_int]
    rt.cudaFree.argtypes = [ctypes.c_void_p]
    return rt


def device_count():
    if not prism.has_cuda():
        return 0
    if torch.cuda.is_available():
        return torch.cuda.device_count()
    rt = cuda_runtime()
    count = ctypes.c_int(0)
    return count.value if rt is not None and rt.cudaGetDeviceCount(ctypes.byref(count)) == 0 else 0


@unittest.skipUnless(device_count() > 0, "no CUDA device")
class TransferCudaTest(unittest.TestCase):
    def check_fetches_equal_the_cpu_ones(self, make_dst, to_host, numel):
        blocks = [weights(numel, 10 + b) for b in range(4)]
        cpu = prism.Transfer("cpu", max_block_bytes=2 * numel)
        gpu = prism.Transfer("cuda", max_block_bytes=2 * numel)
        for b, w in enumerate(blocks):
            cpu.add_block(b, w)
            gpu.add_block(b, w)
        for fmt in ("bf16",) + LOW:
            dsts = [make_dst(w.numel()) for w in blocks]
            tickets = [gpu.fetch(b, fmt, dsts[b]) for b in range(len(blocks))]
            for tk in tickets:
                gpu.wait_stream(tk)
            for b, w in enumerate(blocks):
                want = torch.empty(w.numel(), dtype=torch.bfloat16)
                cpu.wait(cpu.fetch(b, fmt, want))
                self.assertTrue(torch.equal(to_host(dsts[b]), want.view(torch.int16)), (b, fmt))
        gpu.synchronize()
        gpu.close()

    def test_cuda_fetches_equal_the_cpu_ones(self):
        if torch.cuda.is_available():  # torch's CUDA tensors
            self.check_fetches_equal_the_cpu_ones(lambda n: torch.empty(n, dtype=torch.bfloat16, device="cuda"),
                                                  lambda d: d.cpu().view(torch.int16), 3 << 20)
            return
        rt = cuda_runtime()  # device arrays of the runtime at PRISM_CUDART
        made = []

        def make(n):
            made.append(DeviceArray(rt, n))
            return made[-1]
        self.check_fetches_equal_the_cpu_ones(make, DeviceArray.to_host, 3 << 18)
        for d in made:
            d.free()

    @unittest.skipUnless(cuda_runtime() is not None, "PRISM_CUDART names no CUDA runtime")
    def test_cuda_fetch_refuses_a_destination_of_the_wrong_shape(self):
        rt = cuda_runtime()
        t = prism.Transfer("cuda", max_block_bytes=2048)
        t.add_block(0, weights(1000, 1))
        d = DeviceArray(rt, 999)
        with self.assertRaises(prism.PrismError) as e:
            t.fetch(0, "int8", d)
        self.assertEqual(e.exception.message, "dst: 999 elements, block 0 has 1000")
        with self.assertRaises(prism.PrismError) as e:
            t.fetch(0, "int8", torch.empty(1000, dtype=torch.bfloat16))
        self.assertEqual(e.exception.message, "dst: in cpu memory, but the engine is cuda")
        d.free()
        t.close()


if __name__ == "__main__":
    unittest.main()
