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

gpu_report.py --json DIR > DIR/report.json writes the rows as one JSON array instead (the
file committed as benches/results/<date>-<device>.json): per case `case`, `ours_seconds`,
`anchor_seconds`, `anchor`, `ratio` (anchor / ours: above 1, we are faster), `kernel_tflops`,
`peak_tflops` (the FMA-loop peak of the same run), `vendor_peak_tflops`, `device`, `driver`,
plus the case's own fields; `bench_gemm`'s rows (peaks, every GEMM variant), the kNN and
loss benches against PML/torch on CUDA, and `hunt.jsonl`'s in-process rows when present.
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
        elif r["func"].startswith("classifier_"):
            key = (r["func"], r.get("B"), r.get("D"), r.get("C"))
        else:
            key = (r["func"], r.get("B"), r.get("M"), r.get("C"))
        by_case[key] = r
    print("## kNN, mining and the memory bank\n")
    print("| case | ours s | GFLOP/s | % fp32 peak | host waits per op | submissions per op | PML CUDA s | × PML |")
    print("|---|---|---|---|---|---|---|---|")
    for r in ours:
        if "func" not in r:
            continue
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
        elif r["func"].startswith("classifier_"):
            case = f"{r['func']} B={r['B']} D={r['D']} C={r['C']}, both gradients"
            if r.get("path") == "cpu":
                case += ", native path"
            key = (r["func"], r["B"], r["D"], r["C"])
            gflops = None
        else:
            what = "triplets"
            if r["func"].startswith("loss_pair_"):
                what = "in the mean"
            elif r["func"].startswith("loss_"):
                what = "non-zero triplets"
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


def report_json(d):
    """The rows of report.json (see the module docs)."""
    ours = records(os.path.join(d, "results.jsonl"))
    pml = records(os.path.join(d, "pml.jsonl"))
    hunt = records(os.path.join(d, "hunt.jsonl"))
    gpu = open(os.path.join(d, "gpu.txt")).read().strip() if os.path.exists(os.path.join(d, "gpu.txt")) else ""
    device = next((r["device"] for r in ours if r.get("device")), gpu.split(",")[0] if gpu else "unknown")
    driver = next((r["driver"] for r in ours if r.get("driver")), "unknown")
    if gpu and "," in gpu:
        driver = f"{driver} (nvidia-smi: {gpu.split(',')[1].strip()})"
    vendor_peak, _ = peak_tflops(gpu or device)
    fma = next((r["kernel_tflops"] for r in ours if r.get("case") == "peak-fma"), None)
    rows = []

    def row(case, ours_s, anchor_s=None, anchor=None, **extra):
        out = {"case": case, "ours_seconds": ours_s, "anchor_seconds": anchor_s, "anchor": anchor,
               "ratio": (anchor_s / ours_s) if (anchor_s and ours_s) else None,
               "peak_tflops": fma, "vendor_peak_tflops": vendor_peak, "device": device, "driver": driver}
        out.update(extra)
        rows.append(out)

    torch_gemm = {(r["Q"], r["N"], r["D"]): r for r in pml if r.get("func") == "gemm"}
    pml_knn = {r["k"]: r for r in pml if r.get("func") == "knn"}
    torch_loss = {(r["func"], r["B"]): r for r in pml if r.get("func") in ("loss_ntxent", "loss_mnrl")}
    skip = ("case", "device", "driver", "peak_tflops")
    for r in ours:
        case = r.get("case")
        if case in ("peak-fma", "peak-copy"):
            row(case, None, **{k: v for k, v in r.items() if k not in skip})
        elif case and case.startswith("gemm-") and "skipped" not in r:
            # gemm-QxNxD (the tile) or gemm-knn-QxNxD-kK (kNN's distance GEMM). Device-side
            # both: our kernel's time by timestamps against cuBLAS's product of that shape.
            shape = case.removeprefix("gemm-").removeprefix("knn-").split("-")[0]
            q, n, dim = (int(v) for v in shape.split("x"))
            t = torch_gemm.get((q, n, dim))
            extra = {k: v for k, v in r.items() if k not in skip + ("ours_seconds",)}
            ours = r["gemm_seconds"] if "gemm_seconds" in r else r["kernel_seconds"]
            row(case, ours, t["median_s"] if t else None,
                "torch fp32 q @ r.T (cuBLAS, TF32 off), on the device" if t else None,
                wall_seconds=r["ours_seconds"], **extra)
        elif r.get("func") == "knn":
            t = pml_knn.get(r["k"])
            row(f"knn-{r['Q']}x{r['N']}x128-k{r['k']}", r["median_s"], t["median_s"] if t else None,
                "PML CustomKNN on CUDA (tensors on the device)" if t else None,
                kernel_tflops=(r.get("gflops") or 0) / 1000 or None, host_waits=r.get("host_waits"))
        elif r.get("func") in ("loss_ntxent", "loss_mnrl"):
            t = torch_loss.get((r["func"], r["B"]))
            name = "loss-ntxent" if r["func"] == "loss_ntxent" else "loss-mnrl"
            suffix = "-native" if r.get("path") == "cpu" else ""
            row(f"{name}-{r['B']}x768{suffix}", r["median_s"], t["median_s"] if t else None,
                "torch full-matrix loss on CUDA, forward and backward" if t else None,
                peak_device_mib=r.get("peak_device_mib"))
    # PML's pair losses: ours (both paths) against PML on CUDA at the same (B, M); PML's error
    # (out of memory, references refused) kept as the anchor's figure. Each wgpu row gains its
    # kernels' GPU seconds from kernels.jsonl (`--kernel-timing`) where that ran.
    pml_pair = {(r["func"], r["B"], r["M"]): r for r in pml if r.get("func", "").startswith("loss_pair_")}
    timed = {(r["func"], r["B"], r["M"]): r.get("kernels")
             for r in records(os.path.join(d, "kernels.jsonl")) if r.get("func", "").startswith("loss_pair_")}
    for r in ours:
        func = r.get("func", "")
        if not func.startswith("loss_pair_"):
            continue
        key = (func, r["B"], r["M"])
        t = pml_pair.get(key, {})
        native = r.get("path") == "cpu"
        extra = {"anchor_error": t["error"]} if "error" in t else {}
        if "peak_cuda_mib" in t:
            extra["anchor_peak_cuda_mib"] = t["peak_cuda_mib"]
        if not native and timed.get(key):
            extra["kernels"] = timed[key]
        row(f"{func.replace('_', '-')}-{r['B']}x{r['M']}{'-native' if native else ''}", r["median_s"],
            t.get("median_s"), "PML on CUDA, forward and backward (tensors on the device)" if t else None,
            peak_device_mib=r.get("peak_device_mib"), host_waits=r.get("host_waits"), **extra)
    for r in hunt:
        row(r["case"], None, **{k: v for k, v in r.items() if k not in ("case", "device", "driver")})
    return rows


if __name__ == "__main__":
    if len(sys.argv) > 2 and sys.argv[1] == "--json":
        print(json.dumps(report_json(sys.argv[2]), indent=1))
    else:
        main()
