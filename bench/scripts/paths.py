#!/usr/bin/env python3
"""Splits each server's added time to first token into its request path and its response path,
from a packet capture of a `tailcut-bench overhead` run on loopback. usage:

  tcpdump -i lo -s 2000 -w cap.pcap 'tcp and len > 66' &
  tailcut-bench overhead --requests 1000 --warmup 50 --out DIR; kill %1
  bench/scripts/paths.py cap.pcap UPSTREAM_PORT    # the port in DIR/tailcut-bench.toml's base_url

For every request to tailcut (`POST /v1/chat/completions`) and to the bare proxy (`POST /s/...` on
a port other than the upstream's): request path = the client's request packet in -> that server's
request to the upstream out; response path = the upstream's first packet with content text in ->
that server's first packet with content text out to the client. Kernel timestamps, so nothing in
the servers is changed; tcpdump itself slows every way a little alike."""
import re, statistics, subprocess, sys

cap, upstream = sys.argv[1], int(sys.argv[2])
text = subprocess.run(['tcpdump', '-r', cap, '-nn', '-tt', '-A'], capture_output=True, text=True, errors='replace').stdout
head = re.compile(r'^(\d+\.\d+) IP 127\.0\.0\.1\.(\d+) > 127\.0\.0\.1\.(\d+): Flags \[[^\]]*\].*length (\d+)')
packets, cur = [], None
for line in text.splitlines():
    m = head.match(line)
    if m:
        cur = [float(m.group(1)), int(m.group(2)), int(m.group(3)), int(m.group(4)), '']
        packets.append(cur)
    elif cur is not None:
        cur[4] += line
packets = [p for p in packets if p[3] > 0]
content = re.compile(r'"content":"[^"]')
tailcut = next(p[2] for p in packets if 'POST /v1/chat/completions' in p[4])
bare = next(p[2] for p in packets if 'POST /s/' in p[4] and p[2] != upstream)
paths = {tailcut: ([], []), bare: ([], [])}
for i, (t0, client, server, _, payload) in enumerate(packets):
    if server not in paths or 'POST ' not in payload:
        continue
    up = next((p for p in packets[i + 1:] if p[2] == upstream and 'POST /s/' in p[4] and p[1] != client), None)
    if up is None:
        continue
    t2 = next((p[0] for p in packets if p[0] > up[0] and p[1] == upstream and p[2] == up[1] and content.search(p[4])), None)
    t3 = next((p[0] for p in packets[i + 1:] if p[1] == server and p[2] == client and content.search(p[4])), None)
    if t2 is None or t3 is None:
        continue
    paths[server][0].append((up[0] - t0) * 1e6)
    paths[server][1].append((t3 - t2) * 1e6)

def q(v, f):
    v = sorted(v)
    return v[int(f * (len(v) - 1))]

for name, port in (('tailcut', tailcut), ('bare', bare)):
    req, resp = paths[port]
    if not req:
        print(f'{name}: no request matched'); continue
    print(f'{name:8} n={len(req)}  request path p50 {q(req, .5):6.0f} p90 {q(req, .9):6.0f} us   '
          f'response path p50 {q(resp, .5):6.0f} p90 {q(resp, .9):6.0f} us')
