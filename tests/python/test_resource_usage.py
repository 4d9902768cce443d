#!/usr/bin/python3
"""kernels/cuda/resource_usage.py, the tool behind test_cuda_resources, without nvcc: its reading
of ptxas -v and of PTX launch bounds, its sm_90 occupancy and register limits (the rules of the
toolkit's cuda_occupancy.h), the nvcc command it derives from the build's, and the failures it
reports. Each expected figure is worked out by hand in the comment beside it."""

import os
import sys
import unittest

SOURCE = os.environ.get("PRISM_SOURCE_DIR",
                        os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", ".."))
sys.path.insert(0, os.path.join(SOURCE, "kernels", "cuda"))

import resource_usage as ru  # noqa: E402

# ptxas -v as CUDA 13 prints it: an entry with spills, the properties of the function it calls
# (after the entry's own lines), then an entry with shared memory and no calls.
PTXAS = """\
ptxas info    : 0 bytes gmem
ptxas info    : Compiling entry function '_Z6teamsILi1EEvv' for 'sm_90'
ptxas info    : Function properties for _Z6teamsILi1EEvv
    48 bytes stack frame, 20 bytes spill stores, 24 bytes spill loads
ptxas info    : Used 80 registers, used 1 barriers, 48 bytes cumulative stack size, 32 bytes smem
ptxas info    : Compile time = 481.602 ms
ptxas info    : Function properties for _Z9elem_codeILi4EEhf
    8 bytes stack frame, 4 bytes spill stores, 4 bytes spill loads
ptxas info    : Compiling entry function '_Z6decodev' for 'sm_90'
ptxas info    : Function properties for _Z6decodev
    0 bytes stack frame, 0 bytes spill stores, 0 bytes spill loads
ptxas info    : Used 40 registers, used 0 barriers, 1024 bytes smem, 400 bytes cmem[0]
"""

PTX = """\
.visible .entry _Z6teamsILi1EEvv(
\t.param .u64 _Z6teamsILi1EEvv_param_0
)
.maxntid 256, 1, 1
.minnctapersm 3
{
\tret;
}
.entry _Z6decodev(
)
.reqntid 16, 4, 2
.maxnreg 64
{
\tret;
}
.entry _Z4freev()
{
\tret;
}
"""


def record(**kernel):
    k = {"name": "k", "registers": 32, "smem": 0, "stack": 0, "spill_stores": 0, "spill_loads": 0,
         "callees": [], "bounds": {}}
    k.update(kernel)
    return {"source": "kernels/cuda/x.cu", "arch": "sm_90", "kernels": [k]}


class ResourceUsage(unittest.TestCase):
    def test_register_limit_follows_launch_bounds_and_allocation_per_warp(self):
        cases = [
            ((256, 3), 80),    # 65,536 / 768 = 85.3, down to a multiple of 8 per thread
            ((256, 2), 128),   # 16 warps: 4 a quarter of 16,384 registers, 4,096 a warp
            ((256, 1), 255),   # the per-thread maximum
            ((1024, 1), 64),   # 32 warps: 8 a quarter, 2,048 registers a warp
            ((768, 1), 80),    # 24 warps: 6 a quarter, 2,730 -> 2,560 a warp
            ((128, 4), 128),   # 16 warps, as (256, 2)
            ((96, 6), 96),     # 18 warps: 5 a quarter, 3,276 -> 3,072 a warp
        ]
        for (threads, ctas), want in cases:
            with self.subTest(threads=threads, ctas=ctas):
                self.assertEqual(ru.register_limit(threads, ctas), want)
        self.assertEqual(ru.register_limit(256, 1, max_nreg=64), 64)

    def test_occupancy_of_256_thread_ctas_on_h100(self):
        cases = [
            ((40, 0), (6, 0.75, "registers")),    # 1,280 a warp: 12 warps a quarter, 48 an SM
            ((32, 0), (8, 1.0, None)),            # 1,024 a warp: 64 warps, the SM's maximum
            ((96, 32), (2, 0.25, "registers")),   # 3,072 a warp: 5 a quarter, 20 an SM
            ((154, 0), (1, 0.125, "registers")),  # 4,928 -> 5,120 a warp: 3 a quarter
            ((16, 48 * 1024), (4, 0.5, "shared memory")),  # 228 KiB / (48 KiB + 1 KiB)
        ]
        for (regs, smem), want in cases:
            with self.subTest(regs=regs, smem=smem):
                self.assertEqual(ru.occupancy(regs, smem, 256), want)

    def test_ptxas_figures_go_to_their_entry_and_callees_to_the_entry_before_them(self):
        got = ru.parse_ptxas(PTXAS)
        self.assertEqual(list(got), ["_Z6teamsILi1EEvv", "_Z6decodev"])
        t = got["_Z6teamsILi1EEvv"]
        self.assertEqual((t["registers"], t["smem"], t["barriers"], t["stack"], t["spill_stores"],
                          t["spill_loads"]), (80, 32, 1, 48, 20, 24))
        self.assertEqual(t["callees"], [{"mangled": "_Z9elem_codeILi4EEhf", "stack": 8,
                                         "spill_stores": 4, "spill_loads": 4}])
        d = got["_Z6decodev"]
        self.assertEqual((d["registers"], d["smem"], d["cmem"], d["spill_stores"], d["callees"]),
                         (40, 1024, 400, 0, []))

    def test_launch_bounds_come_from_the_ptx_directives_of_each_entry(self):
        self.assertEqual(ru.parse_bounds(PTX), {
            "_Z6teamsILi1EEvv": {"max_threads": 256, "min_ctas": 3},
            "_Z6decodev": {"max_threads": 128, "max_nreg": 64},
            "_Z4freev": {},
        })

    def test_short_name_drops_namespaces_and_parameters_but_not_template_arguments(self):
        cases = [
            ("prism_cu::(anonymous namespace)::quantize_teams_kernel<0, 1>(prism_cu::(anonymous "
             "namespace)::QuantArgs, int, int, int, unsigned long)", "quantize_teams_kernel<0, 1>"),
            ("void prism_cu::decode_kernel<4, 2, false>(prism_cu::DecodeArgs, int)",
             "decode_kernel<4, 2, false>"),
            ("(anonymous namespace)::fill_ones_kernel(float*, unsigned long)", "fill_ones_kernel"),
            ("void teams<1>()", "teams<1>"),
        ]
        for demangled, want in cases:
            self.assertEqual(ru.short_name(demangled), want)

    def test_one_arch_command_keeps_the_build_flags_and_drops_outputs_and_architectures(self):
        build = ["/usr/local/cuda/bin/nvcc", "--options-file", "includes_CUDA.rsp", "-O3", "-DNDEBUG",
                 "--generate-code=arch=compute_75,code=[compute_75,sm_75]", "-gencode",
                 "arch=compute_90,code=sm_90", "-fmad=false", "-std=c++17", "-MD", "-MT", "x.o",
                 "-MF", "x.o.d", "-x", "cu", "-c", "/src/x.cu", "-o", "x.o"]
        self.assertEqual(ru.one_arch_command(build, "90"), [
            "/usr/local/cuda/bin/nvcc", "--options-file", "includes_CUDA.rsp", "-O3", "-DNDEBUG",
            "-fmad=false", "-std=c++17", "-x", "cu", "/src/x.cu", "-cubin", "-arch=sm_90"])

    def test_check_names_the_kernel_and_the_figure(self):
        spill = record(name="teams<1>", registers=80, spill_stores=20, spill_loads=24,
                       bounds={"max_threads": 256, "min_ctas": 3})
        self.assertEqual(ru.problems(spill), [
            "kernels/cuda/x.cu: teams<1> spills to local memory on sm_90: 20 bytes stored, 24 "
            "loaded (in the kernel)"])
        callee = record(name="codes<2>", callees=[{"name": "elem_code<2>", "stack": 8,
                                                   "spill_stores": 4, "spill_loads": 4}])
        self.assertEqual(ru.problems(callee), [
            "kernels/cuda/x.cu: codes<2> spills to local memory on sm_90: 4 bytes stored, 4 loaded "
            "(in elem_code<2>)"])
        bounds = record(name="teams<1>", registers=88, bounds={"max_threads": 256, "min_ctas": 3})
        self.assertEqual(ru.problems(bounds), [
            "kernels/cuda/x.cu: teams<1> uses 88 registers on sm_90; its launch bounds (256 "
            "threads, 3 CTAs an SM) allow 80"])
        self.assertEqual(ru.problems(record(registers=255)), [])
        self.assertEqual(ru.problems(record(registers=80, bounds={"max_threads": 256,
                                                                  "min_ctas": 3})), [])


if __name__ == "__main__":
    unittest.main()
