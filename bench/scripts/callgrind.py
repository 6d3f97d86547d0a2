#!/usr/bin/env python3
"""Ir of each server process in two callgrind runs: usage callgrind.py DIR_SMALL DIR_BIG DIVISOR.
Prints (Ir(big) - Ir(small)) / DIVISOR per server kind, raw and with the inclusive Ir of
quanta::Clock::new (a wall-time-bounded calibration loop at start) taken out of each run."""
import glob,sys,subprocess,re
def quanta(f):
    out=subprocess.run(['callgrind_annotate','--inclusive=yes','--threshold=100',f],capture_output=True,text=True).stdout
    for line in out.splitlines():
        if 'quanta::Clock::new' in line:
            m=re.match(r'\s*([\d,]+)',line)
            if m: return int(m.group(1).replace(',',''))
    return 0
def irs(d):
    out={}
    for f in glob.glob(d+'/*.out*'):
        cmd=None; tot=None
        for line in open(f,errors='replace'):
            if line.startswith('cmd:'): cmd=line[4:].strip()
            elif line.startswith('summary:') or line.startswith('totals:'):
                tot=int(line.split()[1])
        if cmd and ' server ' in cmd:
            kind=cmd.split(' server ')[1].split()[0]
            q=quanta(f)
            a,b=out.get(kind,(0,0)); out[kind]=(a+(tot or 0), b+q)
    return out
a,b,div=irs(sys.argv[1]),irs(sys.argv[2]),float(sys.argv[3])
for k in sorted(b):
    (ta,qa),(tb,qb)=a.get(k,(0,0)),b[k]
    print(f"{k:10} {(tb-ta)/div/1000:8.1f} k raw, {((tb-qb)-(ta-qa))/div/1000:8.1f} k without quanta::Clock::new (quanta Ir {qa} / {qb})")
