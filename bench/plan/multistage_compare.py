#!/usr/bin/env python3
"""tide's three-tier plan beside the multistage schedule of the checkpoint_schedules package at
equal memory (docs/checkpointing.md, "Three tiers"): extra forward steps, disk writes and reads.

multistage(n, ram, disk) keeps `ram` snapshots in memory and `disk` on disk; tide gets ram - 1
device snapshots and 1 host snapshot (the staging one every disk copy passes through) and the same
disk snapshots, in its chain model with the costs below. Conventions differ: checkpoint_schedules
runs step i's forward again (writing its adjoint dependencies) right before its reverse, tide's
backward of layer i reads carry i and does not; so its forward count less 2n - 1 is the count
comparable with tide's extra forwards (checked: with no disk it equals Revolve's,
tide::revolve_extra_forwards).

usage: multistage_compare.py SOURCE_ROOT [COMPILER...]   (pip install checkpoint_schedules)"""
import pathlib, subprocess, sys, tempfile

try:
    import checkpoint_schedules as cs
except ImportError:
    sys.exit("multistage_compare.py: needs checkpoint_schedules (pip install checkpoint_schedules)")

src = pathlib.Path(sys.argv[1] if len(sys.argv) > 1 else ".")
cxx = sys.argv[2:] or ["c++"]
cases = [(20, 3, 1), (20, 3, 3), (50, 3, 2), (50, 4, 4), (100, 4, 4), (100, 6, 10), (200, 5, 8)]


def multistage(n, ram, disk):
    fwd = writes = reads = 0
    for a in cs.MultistageCheckpointSchedule(n, ram, disk):
        if isinstance(a, cs.Forward):
            fwd += a.n1 - a.n0
            writes += a.write_ics and a.storage == cs.StorageType.DISK
        elif isinstance(a, (cs.Copy, cs.Move)):
            reads += a.from_storage == cs.StorageType.DISK
        elif isinstance(a, cs.EndReverse):
            break
    return fwd - (2 * n - 1), writes, reads


prog = r"""
#include <tide/plan/checkpointing.hpp>
#include <cstdio>
#include <cstdlib>
int main(int argc, char** argv) {
  for (int i = 1; i + 2 < argc; i += 3) {
    long n = std::atol(argv[i]), ram = std::atol(argv[i + 1]), disk = std::atol(argv[i + 2]);
    auto c = tide::chain_costs::constant(1, 2, 1, 1);  // f = 1, b = 2, link copies 1, disk write 3, read 2
    c.disk_write_us = 3, c.disk_read_us = 2;
    auto const r = tide::three_tier_plan(n, tide::chain_tiers{.device = ram - 1, .host = 1, .disk = disk}, c);
    auto const two = tide::two_tier_plan(n, ram - 1, 1, c);
    std::printf("%ld %ld %ld %lld %lld %lld %.0f %lld %.0f %lld\n", n, ram, disk, (long long)r.extra_forwards, (long long)r.disk_writes,
                (long long)r.disk_reads, r.predicted_us, (long long)two.extra_forwards, two.predicted_us,
                (long long)tide::revolve_extra_forwards(n, ram));
  }
}
"""
with tempfile.TemporaryDirectory() as tmp:
    cpp, exe = pathlib.Path(tmp) / "t.cpp", pathlib.Path(tmp) / "t"
    cpp.write_text(prog)
    subprocess.run([*cxx, "-std=c++20", "-O2", f"-I{src / 'include'}", str(cpp), "-o", str(exe)], check=True)
    out = subprocess.run([str(exe), *[str(v) for c in cases for v in c]], capture_output=True, text=True, check=True).stdout

print("| n | RAM | disk | multistage: extra fwd / disk w / r | with no disk (Revolve) | tide three-tier: extra fwd / disk w / r | time | tide two-tier: extra fwd | time |")
print("|---|---|---|---|---|---|---|---|---|")
for line in out.split("\n"):
    if not line:
        continue
    n, ram, disk, ef, w, r, t, ef2, t2, rev = line.split()
    mf, mw, mr = multistage(int(n), int(ram), int(disk))
    m0 = multistage(int(n), int(ram), 0)[0]
    assert m0 == int(rev), f"checkpoint_schedules' Revolve ({m0}) differs from tide::revolve_extra_forwards ({rev}) at n={n}, s={ram}"
    print(f"| {n} | {ram} | {disk} | {mf} / {mw} / {mr} | {m0} | {ef} / {w} / {r} | {t} | {ef2} | {t2} |")
