#!/usr/bin/env python3
"""Writes the GPU report's Markdown from what `benches/gpu-report.sh run` collected in DIR:

  gpu.txt        `nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv,noheader`
                 (absent without an NVIDIA driver)
  tests.log      the test binaries' output (their `test result:` lines are summarised)
  distance.md    `bench_report`'s table (distance tile, GFLOP/s, host waits per call)
  results.jsonl  our benches' RESULT records (kNN, mining, bank)
  pml.jsonl      `pml_cuda.py`'s records (absent without torch + CUDA + PML)

Usage: gpu_report.py DIR > DIR/report.md. The fp32 peak comes from WML_FP32_PEAK_TFLOPS, else
from the table below by device name (vendor figures at boost clock, non-tensor fp32), else the
column says "unknown".
"""
import json
import os
import re
import sys

# Non-tensor fp32 TFLOP/s at boost clock (vendor datasheets); first match by substring wins.
FP32_PEAK_TFLOPS = [
    ("H200", 66.9),
    ("H100 NVL", 60.0),
    ("H100 PCIe", 51.2),
    ("H100", 66.9),  # SXM5 ("NVIDIA H100 80GB HBM3")
    ("A100", 19.5),
    ("L40S", 91.6),
    ("L40", 90.5),
    ("L4", 30.3),
    ("A10", 31.2),
    ("RTX 4090", 82.6),
    ("RTX 3090", 35.6),
    ("T4", 8.1),
    ("V100", 15.7),
]


def peak_tflops(device):
    env = os.environ.get("WML_FP32_PEAK_TFLOPS")
    if env:
        return float(env), "WML_FP32_PEAK_TFLOPS"
    for key, tflops in FP32_PEAK_TFLOPS:
        if key in device:
            return tflops, f"datasheet ({key})"
    return None, "unknown"


def records(path):
    if not os.path.exists(path):
        return []
    out = []
    with open(path) as f:
        for line in f:
            line = line.strip()
            if line.startswith("RESULT "):
                line = line[7:]
            if line.startswith("{"):
                out.append(json.loads(line))
    return out


def pct(gflops, peak):
    return "–" if peak is None or gflops is None else f"{100 * gflops / (1000 * peak):.1f} %"


def main():
    d = sys.argv[1]
    ours = records(os.path.join(d, "results.jsonl"))
    pml = records(os.path.join(d, "pml.jsonl"))
    gpu = open(os.path.join(d, "gpu.txt")).read().strip() if os.path.exists(os.path.join(d, "gpu.txt")) else ""
    device = ours[0]["device"] if ours else "unknown"
    driver = next((r["driver"] for r in ours if r.get("driver")), "unknown")
    peak, source = peak_tflops(gpu or device)
    print("# GPU report\n")
    print(f"- adapter: {device}; driver: {driver}")
    if gpu:
        print(f"- nvidia-smi: {gpu}")
    print(f"- fp32 peak: {peak if peak is not None else 'unknown'} TFLOP/s ({source})")
    if os.path.exists(os.path.join(d, "tests.log")):
        results = re.findall(r"test result: (\w+)\. (\d+) passed; (\d+) failed; (\d+) ignored",
                             open(os.path.join(d, "tests.log")).read())
        passed = sum(int(r[1]) for r in results)
        failed = sum(int(r[2]) for r in results)
        ignored = sum(int(r[3]) for r in results)
        verdict = "green" if results and failed == 0 and all(r[0] == "ok" for r in results) else "RED"
        print(f"- test suite with WML_REQUIRE_GPU=1: {verdict} ({passed} passed, {failed} failed, "
              f"{ignored} ignored, {len(results)} binaries)")
    print()
    if os.path.exists(os.path.join(d, "distance.md")):
        print("## Distance tile (`pairwise_distances`, cosine, normalised; upload and readback included)\n")
        rows = [l for l in open(os.path.join(d, "distance.md")) if l.startswith("|")]
        for i, line in enumerate(rows):
            cells = [c.strip() for c in line.strip().strip("|").split("|")]
            if i == 0:
                print(line.rstrip() + " % fp32 peak |")
            elif i == 1:
                print(line.rstrip() + "---|")
            else:
                gflops = float(cells[4]) if cells[0] == "Wgpu" else None
                print(line.rstrip() + f" {pct(gflops, peak)} |")
        print()
    by_case = {}
    infonce = ("loss_ntxent", "loss_mnrl")
    for r in pml:
        if r["func"] == "knn":
            key = ("knn", r.get("k"))
        elif r["func"] in infonce:
            key = (r["func"], r.get("B"))
        else:
            key = (r["func"], r.get("B"), r.get("M"), r.get("C"))
        by_case[key] = r
    print("## kNN, mining and the memory bank\n")
    print("| case | ours s | GFLOP/s | % fp32 peak | host waits per op | submissions per op | PML CUDA s | × PML |")
    print("|---|---|---|---|---|---|---|---|")
    for r in ours:
        if r["func"] == "knn":
            case = f"kNN {r['Q']} × {r['N']} × 128, k = {r['k']}, cosine"
            key = ("knn", r["k"])
            gflops = r.get("gflops")
        elif r["func"] in infonce:
            case = f"{r['func']} B={r['B']} ({r['count']:,} positive pairs)"
            if r.get("path") == "cpu":
                case += ", native path"
            key = (r["func"], r["B"])
            gflops = None
        else:
            what = "non-zero triplets" if r["func"].startswith("loss_") else "triplets"
            case = f"{r['func']} B={r['B']} M={r['M']} C={r['C']} ({r['count']:,} {what})"
            if r.get("path") == "cpu":
                case += ", native path"
            key = (r["func"], r["B"], r["M"], r["C"])
            gflops = None
        theirs = by_case.get(key)
        their_s = theirs.get("median_s") if theirs else None
        ratio = f"{their_s / r['median_s']:.2f}" if their_s else "–"
        their = f"{their_s:.4f}" if their_s else (theirs.get("error", "–") if theirs else "–")
        print(f"| {case} | {r['median_s']:.4f} | {gflops if gflops is not None else '–'} | "
              f"{pct(gflops, peak)} | {r.get('host_waits', '–')} | {r.get('submissions', '–')} | "
              f"{their} | {ratio} |")
    print()
    print("× PML > 1: we are faster. PML runs on tensors already on the GPU; our times include "
          "uploading the inputs and reading the results back to the host.")


if __name__ == "__main__":
    main()
