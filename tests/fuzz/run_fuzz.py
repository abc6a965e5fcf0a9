#!/usr/bin/env python3
"""Runs fuzz_schedule for the test suite.

  run_fuzz.py FUZZER fuzz CORPUS ARTIFACTS [libFuzzer flags...]
      Fuzzes for a bounded time from the committed corpus. New inputs go to a temporary folder
      (libFuzzer writes into its first corpus folder), so the committed corpus is only read;
      a crashing input is written under ARTIFACTS.
  run_fuzz.py FUZZER replay DIR
      Runs every saved input in DIR (regressions), each in its own process; fails if any fails.
"""
import os
import subprocess
import sys
import tempfile


def failed(rc):
    # libFuzzer exits 77 on a crash (its -error_exitcode), which Meson would count as skipped.
    return 0 if rc == 0 else 1


def inputs(d):
    # README.md documents the folder; every other file is an input.
    return sorted(os.path.join(d, f) for f in os.listdir(d) if f != "README.md" and os.path.isfile(os.path.join(d, f)))


def main():
    fuzzer, mode = sys.argv[1], sys.argv[2]
    if mode == "replay":
        files = inputs(sys.argv[3])
        if not files:
            print("no regression inputs")
            return 0
        # One process per input, so that every failing input is named, not just the first.
        bad = [f for f in files if subprocess.call([fuzzer, f]) != 0]
        for f in bad:
            print(f"regression input fails: {f}", file=sys.stderr)
        print(f"{len(files) - len(bad)} of {len(files)} regression inputs pass")
        return failed(len(bad))
    corpus, artifacts, flags = sys.argv[3], sys.argv[4], sys.argv[5:]
    os.makedirs(artifacts, exist_ok=True)
    with tempfile.TemporaryDirectory(prefix="tide_fuzz_") as scratch:
        rc = subprocess.call([fuzzer, "-artifact_prefix=" + os.path.join(artifacts, "")] + flags + [scratch, corpus])
    if rc != 0:
        files = os.path.basename(os.path.normpath(corpus)) == "corpus_files"  # fuzz_files, else fuzz_schedule
        print(f"{os.path.basename(fuzzer)} found a failure: its input is under {artifacts}; replay it with '{fuzzer} FILE'"
              + ("" if files else " (TIDE_FUZZ_VERBOSE=1 describes the schedule)")
              + f" and save it in tests/fuzz/{'regressions_files' if files else 'regressions'}/ with a descriptive name",
              file=sys.stderr)
    return failed(rc)


if __name__ == "__main__":
    sys.exit(main())
