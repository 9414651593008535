#!/bin/bash
cd /work/main
R=experiments/benchmarks/results/host_epyc
L=/tmp/idle61.log
stage() { name=$1; shift; if [ -s $R/$name.json ]; then echo "skip $name" >>$L; return; fi
  echo "== $name start $(date -u +%H:%M:%S) $(uptime)" >>$L
  "$@" --out $R/$name.json >>$L 2>&1
  echo "== $name end $(date -u +%H:%M:%S) rc=$? $(uptime)" >>$L; }
stage cpu_matmul_paths ./launch.sh python -m experiments.benchmarks.cpu_matmul_paths --rounds 5 --options default,ynn_dot_only,eigen,xnnpack,xnn_graph,onednn_custom_call,vector_width_512
stage peer ./launch.sh python -m experiments.benchmarks.peer --rounds 7
stage bf16_compare ./launch.sh python -m experiments.benchmarks.bf16_compare --steps 400 --rounds 7
stage expert_scaling ./launch.sh python -m experiments.benchmarks.expert_scaling --rounds 5
echo "ALL DONE $(date -u +%H:%M:%S)" >>$L
