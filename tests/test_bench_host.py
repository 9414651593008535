"""Every benchmark records the host it ran on (CPU model, ISA flags, cores, load, jax/jaxlib, XLA_FLAGS)."""

import json
import os
import sys

from experiments.benchmarks import capacity_slots
from experiments.benchmarks.timing import ISA_FLAGS, host, host_line

BENCHMARKS = os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "experiments", "benchmarks")


def test_host_record_has_the_fields_a_comparison_needs(monkeypatch):
    monkeypatch.setenv("XLA_FLAGS", "--xla_cpu_use_xnnpack=true")
    info = host()
    assert info["cpu_model"] and info["cpu_count"] == os.cpu_count()
    assert set(info["isa"]) == set(ISA_FLAGS) and all(isinstance(v, bool) for v in info["isa"].values())
    assert len(info["load_avg"]) == 3 and info["jax"] and info["jaxlib"]
    assert info["xla_flags"] == "--xla_cpu_use_xnnpack=true"
    line = host_line({**info, "isa": dict.fromkeys(ISA_FLAGS, False) | {"avx512f": True}, "load_avg": [2.345, 0, 0]})
    assert line == f"{info['cpu_model']}, {info['cpu_count']} cores, avx512f, load 2.3"


def test_a_benchmark_json_carries_its_host(tmp_path, monkeypatch):
    out = tmp_path / "slots.json"
    monkeypatch.setattr(sys, "argv", ["capacity_slots", "--rounds", "1", "--out", str(out)])
    capacity_slots.main()
    got = json.loads(out.read_text())
    assert got["rows"] and set(got["host"]) >= {"cpu_model", "isa", "cpu_count", "load_avg", "jax", "jaxlib", "xla_flags"}


def test_every_benchmark_writes_its_result_through_write_json():
    """The one shared writer adds the host; a benchmark with an --out file must use it."""
    missing = []
    for name in sorted(os.listdir(BENCHMARKS)):
        if name.endswith(".py"):
            with open(os.path.join(BENCHMARKS, name)) as f:
                source = f.read()
            if '"--out"' in source and "write_json(" not in source:
                missing.append(name)
    assert not missing, f"these benchmarks write results without their host (use timing.write_json): {missing}"
