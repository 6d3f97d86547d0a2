#!/usr/bin/env python3
"""usage: dhat_sites.py DHAT_JSON STREAMS [MIN_BYTES_PER_STREAM]

Bytes per stream live at the heap's peak (DHAT's `gb`), by allocation site, largest first, each
with its first frames outside the standard library; then the total and the part held by sites
below the threshold. For `TAILCUT_BENCH_WRAP="valgrind --tool=dhat --dhat-out-file=DIR/dhat.%p.json"
tailcut-bench hold --streams N ...`: a site with one block per stream is per-stream memory."""
import json
import re
import sys

path, n = sys.argv[1], int(sys.argv[2])
floor = float(sys.argv[3]) if len(sys.argv) > 3 else 100.0
d = json.load(open(path))
frames, sites = d["ftbl"], d["pps"]
library = re.compile(r"library/|valgrind|alloc\.rs:23|main\.rs:28|bytes_mut|raw_vec|/vec/|hashbrown|boxed")
rows, total, small, small_blocks = [], 0, 0, 0
for site in sites:
    live, blocks = site.get("gb", 0), site.get("gbk", 0)
    total += live
    if live < n * floor:
        small += live
        small_blocks += blocks
        continue
    keep = [re.sub(r"^0x[0-9A-F]+: ", "", frames[i]) for i in site["fs"] if not library.search(frames[i])]
    rows.append((live, blocks, keep[:5]))
for live, blocks, keep in sorted(rows, key=lambda r: -r[0])[:40]:
    print(f"{live / n:8.0f} B/stream  {blocks / n:.2f} blocks/stream")
    for frame in keep:
        print("       ", frame[:230])
print(f"total {total / n:.0f} B/stream; sites under {floor:.0f} B/stream: {small / n:.0f} B in {small_blocks / n:.1f} blocks/stream")
