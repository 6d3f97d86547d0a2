#!/bin/bash
# usage: callgrind.sh BINARY OUTDIR: callgrind instructions per request (overhead 300 - 100) and per
# relayed event (streams 8 x (300 - 100) chunks) of each server process.
BIN=$1; O=$2; mkdir -p $O
for n in 100 300; do
  mkdir -p $O/req$n
  valgrind --tool=callgrind --trace-children=yes --callgrind-out-file=$O/req$n/c.%p.out $BIN overhead --requests $n --warmup 20 --out $O/req$n > $O/req$n.txt 2>&1
done
for n in 100 300; do
  mkdir -p $O/ev$n
  valgrind --tool=callgrind --trace-children=yes --callgrind-out-file=$O/ev$n/c.%p.out $BIN streams --streams 8 --chunks $n --gap-ms 0 --out $O/ev$n > $O/ev$n.txt 2>&1
done
echo "per request:"; python3 "$(dirname "$0")/callgrind.py" $O/req100 $O/req300 200
echo "per event:"; python3 "$(dirname "$0")/callgrind.py" $O/ev100 $O/ev300 2400
