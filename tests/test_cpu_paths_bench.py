"""The XLA:CPU matmul-path and bfloat16 benchmarks: their checks and summaries (cheap), and their
--smoke runs end to end (slow: each spawns processes that compile)."""

import json
import os
import subprocess
import sys

import pytest

from experiments.benchmarks import bf16_compare, cpu_matmul_paths as paths

# the benchmarks run on one CPU device, as a user runs them (not the suite's 8 fake ones)
ONE_DEVICE = {k: v for k, v in os.environ.items() if k not in ("XLA_FLAGS", "JAX_NUM_CPU_DEVICES")}


def _report(loss: float, ynn: int = 3) -> dict:
    kernels = {"ynn": ynn, "xnn": 0, "onednn": 0, "dot": 2}
    return {"checks": {w: [2.0, loss] for w in paths.WORKLOADS}, "kernels": dict.fromkeys(paths.WORKLOADS, kernels),
            "work": dict.fromkeys(paths.WORKLOADS, 100.0)}


def test_summary_marks_an_option_whose_losses_move_beyond_the_tolerance():
    reports = {"default": _report(1.0), "eigen": _report(1.0 + 1e-7, ynn=0), "vector_width_512": _report(1.01)}
    secs = {"default": dict.fromkeys(paths.WORKLOADS, [2.0, 1.0, 3.0]),
            "eigen": dict.fromkeys(paths.WORKLOADS, [1.0, 1.0, 1.0]),
            "vector_width_512": dict.fromkeys(paths.WORKLOADS, [4.0, 4.0, 4.0])}
    rows = {(r["option"], r["workload"]): r for r in paths.summarize(reports, secs, tolerance=1e-4)}
    base, eigen, wide = rows["default", "dense"], rows["eigen", "dense"], rows["vector_width_512", "dense"]
    assert base["rate"] == 50.0 and base["spread"] == 1.0 and base["ratio_to_default"] == 1.0
    assert eigen["ratio_to_default"] == 2.0 and not eigen["out"] and eigen["kernels"]["ynn"] == 0
    assert wide["ratio_to_default"] == 0.5 and wide["out"]
    assert wide["max_rel_diff_vs_default"] == pytest.approx(0.01 / 2.0)
    assert wide["max_abs_diff_vs_default"] == pytest.approx(0.01)


def test_kernel_counts_read_the_optimized_hlo():
    hlo = "%ynn_fusion = f32[] fusion(%a), kind=kCustom\n%dot.1 = f32[2,2] dot(%a, %b)\n%onednn_fusion.2 = f32[]"
    assert paths._kernels(hlo) == {"ynn": 1, "xnn": 0, "onednn": 1, "dot": 1}


def test_an_unknown_option_is_refused_before_anything_runs(capsys):
    with pytest.raises(SystemExit):
        paths.main(["--options", "default,turbo"])
    assert "'turbo' is not one of default" in capsys.readouterr().err


def test_bf16_curves_compared_from_metrics_files(tmp_path):
    curves = {}
    for dtype, final in (("float32", 3.0), ("bfloat16", 3.25)):
        workdir = tmp_path / dtype
        workdir.mkdir()
        lines = [{"step": 0, "eval_loss": 5.0}, {"step": 10, "loss": 4.0 if dtype == "float32" else 4.5},
                 "not json", {"step": 20, "loss": 3.5, "eval_loss": final}]
        (workdir / "metrics.jsonl").write_text("\n".join(x if isinstance(x, str) else json.dumps(x) for x in lines))
        curves[dtype] = bf16_compare.read_curve(str(workdir))
    assert curves["float32"]["eval_loss"] == [[0, 5.0], [20, 3.0]]
    got = bf16_compare.compare_curves(curves)
    assert got["final_eval_loss_diff_bf16_minus_f32"] == 0.25 and got["final_eval_step"] == 20
    assert got["max_train_loss_gap"] == 0.5
    with pytest.raises(FileNotFoundError, match="metrics.jsonl"):
        bf16_compare.read_curve(str(tmp_path / "nowhere"))


@pytest.mark.slow
def test_matmul_paths_smoke_runs_and_checks_the_numbers(tmp_path):
    out = tmp_path / "paths.json"
    subprocess.run([sys.executable, "-m", "experiments.benchmarks.cpu_matmul_paths", "--smoke", "--options",
                    "default,eigen", "--out", str(out)], check=True, env=ONE_DEVICE)
    got = json.loads(out.read_text())
    eigen = [r for r in got["rows"] if r["option"] == "eigen"]
    assert len(eigen) == len(paths.WORKLOADS) and not any(r["out"] for r in eigen)
    assert all(r["kernels"]["ynn"] == 0 for r in eigen) and got["host"]["cpu_model"]


@pytest.mark.slow
def test_bf16_smoke_runs_both_parts(tmp_path):
    out = tmp_path / "bf16.json"
    subprocess.run([sys.executable, "-m", "experiments.benchmarks.bf16_compare", "--smoke", "--out", str(out)],
                   check=True, env=ONE_DEVICE)
    got = json.loads(out.read_text())
    assert got["step"]["bf16_speedup"] > 0 and got["curve"]["final_eval_step"] == 6
