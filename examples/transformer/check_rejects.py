#!/usr/bin/env python3
"""Bad command lines of the transformer demo: each must exit with status 2 (a usage error) and a
message naming what was wrong; a crash (a signal, any other status) fails the test."""
import subprocess
import sys

CASES = [
    (["--frobnicate"], "unknown argument"),
    (["--width", "0"], "width"),
    (["--steps", "-1"], "--steps"),
    (["--repeats", "0"], "--repeats"),
    (["--settle", "-1"], "--settle must be at least 0"),
    (["--calibration-rounds", "0"], "--calibration-rounds must be at least 1"),
    (["--micro-batch", "0"], "--micro-batch"),
    (["--heads", "5"], "heads"),
    (["--experts", "4", "--top-k", "5"], "top_k"),
    (["--layers", "2", "--dense-layers", "2"], "--dense-layers"),
    (["--link-ratio", "0"], "--link-ratio"),
    (["--vocab", "1"], "--vocab"),
    (["--small", "--budget", "1024"], "--budget"),
]


def main():
    exe = sys.argv[1]
    bad = 0
    for args, word in CASES:
        p = subprocess.run([exe] + args, capture_output=True, text=True, timeout=120)
        ok = p.returncode == 2 and word in p.stderr
        print(f"{'ok  ' if ok else 'FAIL'} {' '.join(args)}: status {p.returncode}: {p.stderr.strip().splitlines()[0] if p.stderr.strip() else '(no message)'}")
        bad += not ok
    return 1 if bad else 0


if __name__ == "__main__":
    sys.exit(main())
