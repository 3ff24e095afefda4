#!/usr/bin/env python3
"""Registers and spills of the CUDA kernels, from ptxas's -v output. Prints one line per kernel
(its instantiations summed up: the most registers, the most spilled bytes) and exits 1 when a
kernel of a decode step spills.

  tools/ptxas-report.py LOG...                        nvcc's own output
  tools/ptxas-report.py --build BUILD_DIR BUILD_LOG   a build of TANDEM_PTXAS_VERBOSE=ON: each
      CUDA object's ptxas output is kept in BUILD_DIR/ptxas/ (a rebuild replaces only the
      objects it compiled), and every CUDA object of the build must have one."""
import os
import re
import shutil
import subprocess
import sys

# The kernels of a decode step (issue 27): registers spilled to local memory there are reads and
# writes of memory on the path whose every microsecond counts.
DECODE_KERNELS = {
    "rows_kernel", "router_route_kernel", "expert_gate_up_rows", "expert_down_rows",
    "quantize_q8_kernel", "mla_split_kernel", "mla_merge_kernel", "latent_store_kernel",
    "rms_norm_kernel", "reduce_kernel", "reduce_norm_kernel", "route_kernel", "gqa_attention_kernel",
    "get_rows_kernel", "add_kernel", "rope_kernel", "kv_store_kernel", "pick_replicas_kernel",
    "add_parts_kernel", "fill_kernel", "copy_rows_kernel",
}

# Instantiations for these formats are reported but not gated: the grid i-quants' and ternary
# formats' decoders hold more state than the others and spilled from the start (2026-12-06);
# their decode kernels want their own rows-per-warp choices, measured on a GPU.
UNGATED_FORMATS = {"IQ2_XXS", "IQ2_XS", "IQ3_XXS", "IQ1_S", "IQ1_M", "IQ3_S", "IQ2_S", "TQ1_0",
                   "TQ2_0"}


def dtype_names():
    """DType values to names, from src/core/dtype.h."""
    path = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "src", "core", "dtype.h")
    return {m.group(2): m.group(1) for m in re.finditer(r"^\s*(\w+) = (\d+),", open(path).read(), re.M)}


def demangled(mangled):
    if not shutil.which("c++filt"):
        print("ptxas-report: c++filt not found (binutils); kernel names stay mangled")
        return mangled
    return subprocess.run(["c++filt"], input="\n".join(mangled), capture_output=True, text=True,
                          check=True).stdout.splitlines()


def entries_of(lines):
    """[mangled, registers, spill bytes] per entry function; a "Function properties" block
    counts for the entry it names (not for a device function ptxas reports beside it)."""
    entries, current, props_for = [], None, None
    for line in lines:
        if m := re.search(r"Compiling entry function '([^']+)'", line):
            current = [m.group(1), 0, 0]
            entries.append(current)
        elif m := re.search(r"Function properties for (\S+)", line):
            props_for = m.group(1)
        elif current and props_for == current[0] and (m := re.search(
                r"(\d+) bytes spill stores, (\d+) bytes spill loads", line)):
            current[2] = int(m.group(1)) + int(m.group(2))
        elif current and (m := re.search(r"Used (\d+) registers", line)):
            current[1] = int(m.group(1))
    return entries


def keep_per_object(build_dir, build_log):
    """Splits a ninja log (each command's output follows its "[n/N] description" line) into
    BUILD_DIR/ptxas/<object>.log; returns the CUDA objects with no kept output."""
    store = os.path.join(build_dir, "ptxas")
    os.makedirs(store, exist_ok=True)
    chunks, current = {}, None
    for line in open(build_log, errors="replace"):
        if m := re.match(r"\[\d+/\d+\] Building CUDA object (\S+)", line):
            current = chunks.setdefault(os.path.basename(m.group(1)), [])
        elif line.startswith("["):
            current = None
        elif current is not None:
            current.append(line)
    for name, lines in chunks.items():
        with open(os.path.join(store, name + ".log"), "w") as out:
            out.writelines(lines)
    missing = []
    for root, _, files in os.walk(build_dir):
        for f in files:
            if f.endswith(".cu.o") and not os.path.exists(os.path.join(store, f + ".log")):
                missing.append(f)
    return [os.path.join(store, f) for f in sorted(os.listdir(store))], missing


def report(paths):
    entries = []
    for path in paths:
        entries += entries_of(open(path, errors="replace"))
    if not entries:
        print("ptxas-report: no ptxas -v output in " + " ".join(paths))
        return 1
    types = dtype_names()
    kernels, ungated = {}, []
    for full, (_, regs, spilled) in zip(demangled([e[0] for e in entries]), entries):
        full = full.replace("(anonymous namespace)::", "")
        full = re.sub(r"\(tandem::DType\)(\d+)", lambda m: types.get(m.group(1), m.group(1)), full)
        name = re.sub(r"<.*", "", full.split("(")[0]).split("::")[-1].split(" ")[-1]
        formats = set(re.findall(r"Decoder<(\w+)>", full))
        k = kernels.setdefault(name, {"n": 0, "regs": 0, "spill": 0, "worst": ""})
        k["n"] += 1
        k["regs"] = max(k["regs"], regs)
        if spilled and formats & UNGATED_FORMATS:
            ungated.append(f"{spilled:>6} bytes  {full[:150]}")
        elif spilled > k["spill"]:
            k["spill"], k["worst"] = spilled, full
    failed = False
    print(f"{'kernel':28} {'instances':>9} {'max regs':>8} {'max spill bytes':>15}")
    for name in sorted(kernels):
        k = kernels[name]
        decode = name in DECODE_KERNELS
        mark = "  SPILLS (decode kernel)" if decode and k["spill"] else ""
        print(f"{name:28} {k['n']:>9} {k['regs']:>8} {k['spill']:>15}{mark}")
        if decode and k["spill"]:
            print(f"    worst: {k['worst'][:160]}")
            failed = True
    if ungated:
        print(f"not gated ({', '.join(sorted(UNGATED_FORMATS))}): {len(ungated)} instantiations spill")
        for line in ungated:
            print("  " + line)
    return 1 if failed else 0


def main(args):
    if args[:1] == ["--build"] and len(args) == 3:
        paths, missing = keep_per_object(args[1], args[2])
        if missing:
            print("ptxas-report: no ptxas output kept for " + ", ".join(missing) +
                  " (compiled before TANDEM_PTXAS_VERBOSE=ON): touch their .cu files and rebuild")
            return 1
        return report(paths)
    if not args or args[0].startswith("-"):
        print(__doc__)
        return 2
    return report(args)


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
