#!/usr/bin/python3
"""The registers, shared memory, stack and spills of every CUDA kernel the build compiles, as
ptxas allocates them for sm_90 (H100), and the check on them that test_cuda_resources runs. No GPU
is needed: these are the compiler's figures (DESIGN 8.1), not measurements.

  resource_usage.py compile --commands compile_commands.json --target T --source S.cu \\
                            --output S.json [--depfile S.d] [--arch 90]
      Compiles S as the build compiles it for target T (T's entry in CMake's
      compile_commands.json: the same nvcc, include directories, definitions and flags), for
      sm_ARCH only, to a cubin, with ptxas -v. Writes S.json, one record per kernel (__global__
      function) with its launch bounds read from nvcc's PTX (.maxntid / .reqntid, .minnctapersm,
      .maxnreg), prints one line per kernel and, with --depfile, the headers S includes.

  resource_usage.py check S.json...
      Prints every kernel's line, then fails (exit 1), naming the kernel and the figure, on any
      spill store or load (in the kernel or in a function it calls that ptxas kept as a call) and
      on a register count that breaks the kernel's launch bounds or the 255 per thread every
      kernel is held to.

Occupancy follows the CUDA toolkit's cuda_occupancy.h for compute capability 9.0: registers are
allocated per warp in units of 256 within each of the SM's 4 sub-partitions (16,384 registers
each), at most 64 warps and 32 CTAs an SM, 228 KiB of shared memory an SM with 1 KiB reserved per
CTA, allocated in units of 128 bytes."""
import argparse
import glob
import json
import os
import re
import shlex
import subprocess
import sys
import tempfile

# Compute capability 9.0 (cuda_occupancy.h; the H100 SXM and PCIe have the same SM).
SM90 = {
    "regs_per_sm": 65536,
    "sub_partitions": 4,
    "reg_unit": 256,          # registers allocated per warp in units of this many
    "max_regs_per_thread": 255,
    "max_warps_per_sm": 64,
    "max_ctas_per_sm": 32,
    "smem_per_sm": 228 * 1024,
    "smem_reserved_per_cta": 1024,
    "smem_unit": 128,
}


def round_up(x, unit):
    return (x + unit - 1) // unit * unit


def ctas_by_registers(regs, threads, arch=SM90):
    """CTAs of `threads` threads using `regs` registers each that fit an SM's register file."""
    if regs > arch["max_regs_per_thread"]:
        return 0
    if regs == 0:
        return arch["max_ctas_per_sm"]
    warps = (threads + 31) // 32
    per_warp = round_up(regs * 32, arch["reg_unit"])
    per_partition = arch["regs_per_sm"] // arch["sub_partitions"]
    if per_warp * round_up(warps, arch["sub_partitions"]) > arch["regs_per_sm"]:
        return 0
    return per_partition // per_warp * arch["sub_partitions"] // warps


def occupancy(regs, smem, threads, arch=SM90):
    """Theoretical occupancy of a kernel launched with CTAs of `threads` threads: (CTAs per SM,
    fraction of the SM's warps, what limits it below a full SM or None)."""
    warps = (threads + 31) // 32
    limits = {
        "warps": arch["max_warps_per_sm"] // warps,
        "CTAs": arch["max_ctas_per_sm"],
        "registers": ctas_by_registers(regs, threads, arch),
        "shared memory": arch["smem_per_sm"]
        // round_up(smem + arch["smem_reserved_per_cta"], arch["smem_unit"]),
    }
    ctas = min(limits.values())
    fraction = ctas * warps / arch["max_warps_per_sm"]
    limiter = min(limits, key=lambda k: (limits[k], k != "registers")) if fraction < 1 else None
    return ctas, fraction, limiter


def register_limit(threads, min_ctas, max_nreg=None, arch=SM90):
    """The most registers a thread may use under __launch_bounds__(threads, min_ctas) (and
    .maxnreg): the largest count at which min_ctas CTAs of `threads` fit an SM."""
    limit = arch["max_regs_per_thread"]
    if max_nreg:
        limit = min(limit, max_nreg)
    while limit > 0 and ctas_by_registers(limit, threads, arch) < max(min_ctas, 1):
        limit -= 1
    return limit


# ---- compile ------------------------------------------------------------------------------------

# Flags of the build's command that do not belong in a one-architecture compile to a cubin: the
# output, the object step, dependency files and every architecture option. Those taking a value as
# the next argument are in the first set.
DROP_WITH_VALUE = {"-o", "-MT", "-MF", "-MQ", "--dependency-output", "-arch", "--gpu-architecture",
                   "-gencode", "--generate-code", "-code", "--gpu-code"}
DROP = {"-c", "--compile", "-MD", "-MMD", "-MP", "--generate-dependencies-with-compile",
        "--generate-nonsystem-dependencies-with-compile", "-ptx", "--ptx", "-cubin", "--cubin"}
DROP_PREFIX = ("-arch=", "--gpu-architecture=", "-gencode=", "--generate-code=", "-code=",
               "--gpu-code=", "-MF=", "--dependency-output=")


def one_arch_command(args, arch):
    """The build's nvcc arguments with only what a cubin for sm_<arch> needs of them."""
    out = []
    skip = False
    for a in args:
        if skip:
            skip = False
        elif a in DROP_WITH_VALUE:
            skip = True
        elif a == "-dc" or a == "--device-c":
            out.append("-rdc=true")
        elif a not in DROP and not a.startswith(DROP_PREFIX):
            out.append(a)
    return out + ["-cubin", "-arch=sm_%s" % arch]


def find_command(commands, target, source):
    """The compile_commands.json entry that compiles `source` into `target`'s objects."""
    want = os.path.realpath(source)
    marker = "CMakeFiles/%s.dir/" % target
    found = []
    for e in commands:
        path = os.path.join(e["directory"], e["file"])
        args = e["arguments"] if "arguments" in e else shlex.split(e["command"])
        if os.path.realpath(path) == want and any(marker in a for a in args):
            found.append((e["directory"], args))
    if len(found) != 1:
        sys.exit("resource_usage.py: %d compile commands for %s in target %s (CMake writes them "
                 "when CMAKE_EXPORT_COMPILE_COMMANDS is on)" % (len(found), source, target))
    return found[0]


def parse_ptxas(text):
    """ptxas -v's lines as {mangled name: record} for the entry functions, in ptxas's order. The
    properties of a called (not inlined) function follow the entry that calls it, once per
    entry, and are kept as that entry's callees."""
    entries = {}
    entry = None
    props = None
    for line in text.splitlines():
        m = re.search(r"Compiling entry function '([^']+)' for '(\w+)'", line)
        if m:
            entry = {"mangled": m.group(1), "arch": m.group(2), "registers": 0, "smem": 0,
                     "cmem": 0, "barriers": 0, "stack": 0, "spill_stores": 0, "spill_loads": 0,
                     "callees": []}
            entries[entry["mangled"]] = entry
            props = None
            continue
        m = re.search(r"Function properties for (\S+)", line)
        if m:
            props = m.group(1)
            continue
        m = re.search(r"(\d+) bytes stack frame, (\d+) bytes spill stores, (\d+) bytes spill loads",
                      line)
        if m and props:
            figures = {"stack": int(m.group(1)), "spill_stores": int(m.group(2)),
                       "spill_loads": int(m.group(3))}
            if entry and props == entry["mangled"]:
                entry.update(figures)
            elif entry:
                entry["callees"].append(dict(figures, mangled=props))
            else:
                sys.exit("resource_usage.py: ptxas reported %s before any entry function" % props)
            props = None
            continue
        m = re.search(r"Used (\d+) registers", line)
        if m and entry:
            entry["registers"] = int(m.group(1))
            for key, pattern in (("smem", r"(\d+) bytes smem"), ("cmem", r"(\d+) bytes cmem\[0\]"),
                                 ("barriers", r"used (\d+) barriers")):
                f = re.search(pattern, line)
                if f:
                    entry[key] = int(f.group(1))
    return entries


def parse_bounds(ptx):
    """{mangled name: launch bounds} from the PTX directives between an .entry's parameters and
    its body."""
    bounds = {}
    for m in re.finditer(r"^\s*(?:\.visible\s+|\.weak\s+)*\.entry\s+([\w$.]+)", ptx, re.M):
        body = ptx.find("\n{", m.end())
        head = ptx[m.end():body if body >= 0 else len(ptx)]
        b = {}
        ntid = re.search(r"\.(maxntid|reqntid)\s+(\d+)(?:\s*,\s*(\d+))?(?:\s*,\s*(\d+))?", head)
        if ntid:
            b["max_threads"] = 1
            for d in ntid.groups()[1:]:
                b["max_threads"] *= int(d) if d else 1
        for key, directive in (("min_ctas", "minnctapersm"), ("max_nreg", "maxnreg")):
            d = re.search(r"\.%s\s+(\d+)" % directive, head)
            if d:
                b[key] = int(d.group(1))
        bounds[m.group(1)] = b
    return bounds


def demangle(names):
    if not names:
        return {}
    out = subprocess.run(["c++filt"], input="\n".join(names) + "\n", capture_output=True,
                         text=True, check=True).stdout.splitlines()
    return dict(zip(names, out))


def short_name(demangled):
    """`void ns::(anonymous namespace)::kernel<0, 1>(args...)` as `kernel<0, 1>`."""
    s = demangled
    if s.endswith(")"):
        depth = 0
        for i in range(len(s) - 1, -1, -1):
            depth += {")": 1, "(": -1}.get(s[i], 0)
            if depth == 0:
                s = s[:i]
                break
    depth, start = 0, 0
    for i, c in enumerate(s):
        depth += {"<": 1, ">": -1, "(": 1, ")": -1}.get(c, 0)
        if depth == 0 and s.startswith("::", i):
            start = i + 2
        elif depth == 0 and c == " ":
            start = i + 1
    return s[start:]


def read_depfile(path, cwd):
    """The prerequisites of a Makefile-style depfile, as absolute paths."""
    with open(path) as f:
        text = f.read().replace("\\\n", " ")
    _, _, deps = text.partition(": ")
    tokens = re.findall(r"(?:\\ |\S)+", deps)
    return [os.path.normpath(os.path.join(cwd, t.replace("\\ ", " "))) for t in tokens]


def cmd_compile(opts):
    with open(opts.commands) as f:
        cwd, args = find_command(json.load(f), opts.target, opts.source)
    if not os.path.basename(args[0]).startswith("nvcc"):
        sys.exit("resource_usage.py: %s is not compiled by nvcc (%s)" % (opts.source, args[0]))
    out_dir = os.path.dirname(os.path.abspath(opts.output))
    os.makedirs(out_dir, exist_ok=True)
    with tempfile.TemporaryDirectory(dir=out_dir, prefix=".resource_usage.") as tmp:
        cmd = one_arch_command(args, opts.arch) + [
            "-o", os.path.join(tmp, "kernels.cubin"), "-Xptxas", "-v", "--keep", "--keep-dir", tmp]
        if opts.depfile:
            cmd += ["-MD", "-MF", os.path.join(tmp, "deps.d")]
        run = subprocess.run(cmd, cwd=cwd, capture_output=True, text=True)
        log = run.stdout + run.stderr
        if run.returncode != 0:
            sys.stderr.write(log)
            sys.exit("resource_usage.py: nvcc failed on %s (exit %d): %s" %
                     (opts.source, run.returncode, shlex.join(cmd)))
        ptx = glob.glob(os.path.join(tmp, "*.ptx"))
        if len(ptx) != 1:
            sys.exit("resource_usage.py: expected one PTX file from nvcc, found %d" % len(ptx))
        with open(ptx[0]) as f:
            bounds = parse_bounds(f.read())
        deps = read_depfile(os.path.join(tmp, "deps.d"), cwd) if opts.depfile else []
    # ptxas's other lines (warnings) are the build's business; pass them on.
    for line in log.splitlines():
        if not line.startswith("ptxas info") and not re.match(r"\s+\d+ bytes stack frame", line):
            print(line, file=sys.stderr)

    entries = parse_ptxas(log)
    names = demangle(sorted(set(list(entries) + [c["mangled"] for e in entries.values()
                                                  for c in e["callees"]])))
    kernels = []
    for mangled, e in entries.items():
        e["name"] = short_name(names[mangled])
        e["demangled"] = names[mangled]
        e["bounds"] = bounds.get(mangled, {})
        for c in e["callees"]:
            c["name"] = short_name(names[c["mangled"]])
        kernels.append(e)
    kernels.sort(key=lambda k: natural_key(k["name"]))
    record = {"source": os.path.relpath(os.path.realpath(opts.source), opts.root),
              "target": opts.target, "arch": "sm_%s" % opts.arch, "kernels": kernels}
    with open(opts.output + ".tmp", "w") as f:
        json.dump(record, f, indent=1)
    os.replace(opts.output + ".tmp", opts.output)
    if opts.depfile:
        with open(opts.depfile, "w") as f:
            f.write("%s: \\\n" % os.path.abspath(opts.output).replace(" ", "\\ "))
            f.write(" \\\n".join("  " + d.replace(" ", "\\ ") for d in deps) + "\n")
    sys.stdout.write(table([record]))


# ---- report and check ---------------------------------------------------------------------------

def natural_key(name):
    return [int(t) if t.isdigit() else t for t in re.split(r"(\d+)", name)]


def spills(k):
    """(bytes stored, bytes loaded, where) of a kernel's spills, its callees' included."""
    st, ld, where = k["spill_stores"], k["spill_loads"], []
    if st or ld:
        where.append("the kernel")
    for c in k["callees"]:
        if c["spill_stores"] or c["spill_loads"]:
            st, ld = st + c["spill_stores"], ld + c["spill_loads"]
            where.append(c["name"])
    return st, ld, where


def table(records):
    lines = []
    head = "%-36s %4s %7s %4s %6s %6s %11s  %s" % (
        "kernel", "regs", "bounds", "max", "smem", "stack", "spill st/ld", "occupancy (H100)")
    for r in records:
        lines.append("%s (%s, %s): %d kernel%s" % (r["source"], r["target"], r["arch"],
                                                   len(r["kernels"]), "" if len(r["kernels"]) == 1
                                                   else "s"))
        if not r["kernels"]:
            continue
        lines.append("  " + head)
        for k in r["kernels"]:
            b = k["bounds"]
            threads = b.get("max_threads")
            bound = "-"
            if threads:
                bound = "%d" % threads + (",%d" % b["min_ctas"] if b.get("min_ctas") else "")
            limit = register_limit(threads or 32, b.get("min_ctas", 1), b.get("max_nreg"))
            st, ld, _ = spills(k)
            occ = "- (no launch bounds)"
            if threads:
                ctas, frac, limiter = occupancy(k["registers"], k["smem"], threads)
                occ = "%3.0f%%, %d CTA%s of %d" % (100 * frac, ctas, "" if ctas == 1 else "s",
                                                   threads)
                occ += " (%s)" % limiter if limiter else ""
            lines.append("  %-36s %4d %7s %4d %6d %6d %5d / %-5d  %s" % (
                k["name"], k["registers"], bound, limit, k["smem"], k["stack"], st, ld, occ))
    return "\n".join(lines) + "\n"


def problems(record):
    out = []
    for k in record["kernels"]:
        where = "%s: %s" % (record["source"], k["name"])
        st, ld, who = spills(k)
        if st or ld:
            out.append("%s spills to local memory on %s: %d bytes stored, %d loaded (in %s)" % (
                where, record["arch"], st, ld, ", ".join(who)))
        b = k["bounds"]
        threads, ctas = b.get("max_threads"), b.get("min_ctas", 1)
        limit = register_limit(threads or 32, ctas, b.get("max_nreg"))
        if k["registers"] > limit:
            if threads:
                rule = "its launch bounds (%d threads, %d CTAs an SM%s) allow %d" % (
                    threads, ctas, ", .maxnreg %d" % b["max_nreg"] if b.get("max_nreg") else "",
                    limit)
            else:
                rule = "a thread may have %d" % limit
            out.append("%s uses %d registers on %s; %s" % (where, k["registers"], record["arch"],
                                                           rule))
    return out


def cmd_check(opts):
    records, failures = [], []
    for path in opts.records:
        if not os.path.exists(path):
            failures.append("%s is missing: build the target cuda_resources first" % path)
            continue
        with open(path) as f:
            records.append(json.load(f))
    records.sort(key=lambda r: r["source"])
    sys.stdout.write(table(records))
    for r in records:
        failures += problems(r)
    count = sum(len(r["kernels"]) for r in records)
    if failures:
        print("\nFAILED: %d problem%s in %d kernels of %d files:" % (
            len(failures), "" if len(failures) == 1 else "s", count, len(records)))
        for f in failures:
            print("  " + f)
        return 1
    print("\nOK: %d kernels of %d files, no spills, registers within every launch bound" % (
        count, len(records)))
    return 0


def main():
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    sub = p.add_subparsers(dest="cmd", required=True)
    c = sub.add_parser("compile", help="compile one .cu file for one architecture, ptxas -v")
    c.add_argument("--commands", required=True, help="CMake's compile_commands.json")
    c.add_argument("--target", required=True, help="the CMake target that compiles the source")
    c.add_argument("--source", required=True)
    c.add_argument("--output", required=True, help="the kernels' records (JSON)")
    c.add_argument("--depfile", help="write the headers the source includes here (Makefile style)")
    c.add_argument("--arch", default="90", help="the SM (default 90: H100)")
    c.add_argument("--root", default=os.getcwd(), help="source paths are printed relative to it")
    k = sub.add_parser("check", help="print every kernel; fail on spills and broken launch bounds")
    k.add_argument("records", nargs="+", help="the JSON files of `compile`")
    opts = p.parse_args()
    if opts.cmd == "compile":
        cmd_compile(opts)
        return 0
    return cmd_check(opts)


if __name__ == "__main__":
    sys.exit(main())
