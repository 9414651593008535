"""The fault drill (experiments/tools/fault_drill.py, fault_cases.py) as tests: one per case,
against the shared drill reference run. The cases that train in a process of their own are slow."""

from __future__ import annotations

import os

import pytest

from experiments.tools import drill_runs, fault_cases
from experiments.tools.fault_drill import all_cases


@pytest.fixture(scope="module")
def reference(run_once, corpus_cache):
    """The uninterrupted drill run that tests/test_checkpoint.py shares (checkpoints at 9 and 12)."""
    def build(root):
        os.makedirs(root)
        drill_runs.run_to_end(
            drill_runs.write_config(root, steps=12, every=3, cache_dir=corpus_cache), os.path.join(root, "run"))

    return os.path.join(run_once("drill_reference", build), "run")


@pytest.mark.parametrize("case", [pytest.param(case, id=case.name, marks=[pytest.mark.slow] if case.slow else [])
                                  for case in all_cases()])
def test_fault_drill_case(case, reference, corpus_cache, tmp_path):
    drill = fault_cases.Drill(root=str(tmp_path), cache_dir=corpus_cache, reference_dir=reference)
    detail = case.run(drill)
    assert detail  # what the user saw, as the drill's table prints it
