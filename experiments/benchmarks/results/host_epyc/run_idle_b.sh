#!/bin/bash
cd /work/main
R=experiments/benchmarks/results/host_epyc
L=/tmp/idle61.log
until grep -q "ALL DONE" $L; do sleep 10; done
stage() { name=$1; shift; if [ -s $R/$name.json ]; then echo "skip $name" >>$L; return; fi
  echo "== $name start $(date -u +%H:%M:%S) $(uptime)" >>$L
  "$@" --out $R/$name.json >>$L 2>&1; rc=$?
  echo "== $name end $(date -u +%H:%M:%S) rc=$rc $(uptime)" >>$L; }
stage cpu_matmul_paths ./launch.sh python -m experiments.benchmarks.cpu_matmul_paths --rounds 5 --options default,ynn_dot_only,eigen,vector_width_512
stage cpu_matmul_paths_b ./launch.sh python -m experiments.benchmarks.cpu_matmul_paths --rounds 5 --options default,xnnpack,xnn_graph,onednn_custom_call
echo "ALL DONE B $(date -u +%H:%M:%S)" >>$L
