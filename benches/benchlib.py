"""Helpers shared by the compare_*.py scripts: run one timed process under the benchmark lock
and read its `RESULT {json}` line."""
import json
import subprocess
import sys


def result(cmd, timeout):
    """Runs `cmd` under `flock /tmp/bench.lock`; returns its last RESULT record (echoed to
    stderr), or a status record when it timed out or printed none."""
    try:
        p = subprocess.run(["flock", "/tmp/bench.lock"] + cmd, capture_output=True, text=True, timeout=timeout)
    except subprocess.TimeoutExpired:
        return {"status": f"timeout after {timeout} s"}
    lines = [l for l in p.stdout.splitlines() if l.startswith("RESULT ")]
    if not lines:
        return {"status": "crashed", "stderr": p.stderr[-400:]}
    rec = json.loads(lines[-1][7:])
    print(json.dumps(rec), file=sys.stderr, flush=True)
    return rec


def secs(rec):
    """The median seconds of a record from our examples (`median_s`) or the anchors (`median`)."""
    return rec.get("median_s") if "median_s" in rec else rec.get("median")
