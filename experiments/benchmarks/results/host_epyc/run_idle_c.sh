#!/bin/bash
cd /work/main
R=experiments/benchmarks/results/host_epyc
L=/tmp/idle61.log
until grep -q "ALL DONE B" $L; do sleep 10; done
echo "== peer start $(date -u +%H:%M:%S) $(uptime)" >>$L
./launch.sh python -m experiments.benchmarks.peer --rounds 9 --out $R/peer.json >>$L 2>&1; rc=$?
echo "== peer end $(date -u +%H:%M:%S) rc=$rc $(uptime)" >>$L
echo "ALL DONE C $(date -u +%H:%M:%S)" >>$L
