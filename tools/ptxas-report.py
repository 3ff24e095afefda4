#!/usr/bin/env python3
"""Registers and spills of the CUDA kernels, from ptxas's -v output (a build log of
TANDEM_PTXAS_VERBOSE=ON, or nvcc's own output). Prints one line per kernel (its instantiations
summed up: the most registers, the most spilled bytes) and exits 1 when a kernel of a decode
step spills. Usage: tools/ptxas-report.py LOG..."""
import os
import re
import subprocess
import sys

# The kernels of a decode step (issue 27): registers spilled to local memory there are reads and
# writes of memory on the path whose every microsecond counts.
DECODE_KERNELS = {
    "rows_kernel", "router_route_kernel", "expert_gate_up_rows", "expert_down_rows",
    "quantize_q8_kernel", "mla_split_kernel", "mla_merge_kernel", "latent_store_kernel",
    "rms_norm_kernel", "reduce_kernel", "reduce_norm_kernel", "route_kernel", "gqa_attention_kernel",
    "get_rows_kernel", "add_kernel", "rope_kernel", "kv_store_kernel",
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


def kernel_names(mangled):
    out = subprocess.run(["c++filt"], input="\n".join(mangled), capture_output=True, text=True,
                         check=True).stdout.splitlines()
    names = []
    for full in out:
        full = full.replace("(anonymous namespace)::", "")
        base = re.sub(r"<.*", "", full.split("(")[0])
        names.append((base.split("::")[-1], full))
    return names


def main(paths):
    entries = []  # [mangled, registers, stack, spill stores, spill loads]
    for path in paths:
        current = None
        for line in open(path, errors="replace"):
            if m := re.search(r"Compiling entry function '([^']+)'", line):
                current = [m.group(1), 0, 0, 0, 0]
                entries.append(current)
            elif current and (m := re.search(
                    r"(\d+) bytes stack frame, (\d+) bytes spill stores, (\d+) bytes spill loads",
                    line)):
                current[2:5] = [int(g) for g in m.groups()]
            elif current and (m := re.search(r"Used (\d+) registers", line)):
                current[1] = int(m.group(1))
    if not entries:
        print("ptxas-report: no ptxas -v output in " + " ".join(paths), file=sys.stderr)
        return 1
    types = dtype_names()
    kernels, ungated = {}, []
    for (name, full), e in zip(kernel_names([e[0] for e in entries]), entries):
        full = re.sub(r"\(tandem::DType\)(\d+)", lambda m: types.get(m.group(1), m.group(1)), full)
        formats = set(re.findall(r"Decoder<(\w+)>", full))
        k = kernels.setdefault(name, {"n": 0, "regs": 0, "spill": 0, "worst": ""})
        k["n"] += 1
        k["regs"] = max(k["regs"], e[1])
        spilled = e[3] + e[4]
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


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
