"""Every mistake a user can make on the command line ends in one paragraph: exit 2, no traceback.

The table runs ``moejax.main.main`` in this process (each call parses with its own flag registry,
and every error comes before anything is compiled); a few rows also run as a real subprocess to
check what reaches the terminal. Each row names what the message must contain: the key the user
got wrong and the fix (a corrected flag, the allowed values or an example).
"""
import subprocess
import sys

import pytest

from moejax.main import main

CONFIG = "experiments/configs/tiny_moe.py"
MIXTURE_FIX = "--config.data.mixture.code=0.25"  # the per-domain form, spelled with the dataset's domains

CASES = {
    # unknown keys at every depth, each with the corrected override
    "top-level typo": (["--config.modle.num_layers=4"], ["'modle.num_layers'", 'Did you mean "model"',
                                                         "--config.model.num_layers"]),
    "nested typo": (["--config.model.moe.num_expert=4"], ["'model.moe.num_expert'", "--config.model.moe.num_experts"]),
    "leaf typo": (["--config.train.step=20"], ["'train.step'", "--config.train.steps"]),
    "leaf typo, space form": (["--config.optim.lrr", "0.1"], ["'optim.lrr'", "--config.optim.lr"]),
    "key below a value": (["--config.train.steps.max=3"], ["'train.steps' is a single value", "--config.train.steps=400"]),
    "mixture domain typo": (["--config.data.mixture.cod=0.5"], ["data.mixture names domain 'cod'",
                                                                 "Did you mean 'code'?", MIXTURE_FIX]),
    "unknown option": (["--workdr", "x"], ["unknown option --workdr", "Did you mean --workdir?"]),
    "stray argument": (["extra"], ["unexpected argument 'extra'", "usage: python -m moejax.main"]),
    # wrong types
    "text for an integer": (["--config.train.steps=abc"], ["'train.steps' takes an integer", "--config.train.steps=400"]),
    "fraction for an integer": (["--config.model.num_layers=2.5"], ["flag --config.model.num_layers=2.5",
                                                                    "'model.num_layers' takes an integer"]),
    "not a boolean": (["--config.train.scan_layers=maybe"], ["'train.scan_layers' takes True or False",
                                                              "--config.train.scan_layers=False"]),
    "value for a group": (["--config.train=5"], ["'train' is a group of keys", "--config.train."]),
    "mixture weight not a number": (["--config.data.mixture.code=abc"], ["'data.mixture.code' has value 'abc'",
                                                                          "--config.data.mixture.code=0.5"]),
    "negative mixture weight": (["--config.data.mixture.math=-1"], ["'data.mixture.math' has value '-1'",
                                                                    "a finite weight >= 0"]),
    "mixture switch": (["--noconfig.data.mixture.code"], ["data.mixture.code is not a switch",
                                                          "--config.data.mixture.code=0.5"]),
    # unknown domains and bad JSON text
    "unknown domain, JSON form": (['--config.data.mixture={"recipes": 1}'], ["data.mixture names domain 'recipes'",
                                                                             MIXTURE_FIX, "--config.data.mixture='{"]),
    "unknown domain, per-key form": (["--config.data.mixture.recipes=0.4"], ["domain 'recipes'", MIXTURE_FIX]),
    "bad JSON mixture": (['--config.data.mixture={"code": 1'], ["'data.mixture'", "not valid JSON",
                                                                 "--config.data.mixture='{\"code\": 0.5"]),
    "JSON mixture not an object": (["--config.data.mixture=[1, 2]"], ["'data.mixture'", "a non-empty JSON object"]),
    "bad JSON schedule": (['--config.data.schedule=[[0, {"code": 1}'], ["data.schedule is not valid JSON",
                                                                        "--config.data.schedule='[[0,"]),
    "missing dataset": (["--config.data.path=/nonexistent/ds"], ["data.path '/nonexistent/ds' does not exist",
                                                                 "python -m moejax.data.prepare"]),
    "missing config file": (None, ["/nope.py' not found", "experiments/configs/tiny_moe.py"]),  # the absolute path
    "argument to a config without one": ("tiny_moe.py:foo", ["experiments/configs/tiny_moe.py:foo' could not be "
                                                             "loaded", "get_config() takes 0 positional arguments",
                                                             "the ':argument' after the file name"]),
    # impossible values and combinations, reported against the key the user changed
    "too many experts per token": (["--config.model.moe.experts_per_token=20"],
                                   ["'model.moe.experts_per_token' has value 20", "at most model.moe.num_experts=8"]),
    "fewer experts than top-k": (["--config.model.moe.num_experts=1"],
                                 ["'model.moe.num_experts' has value 1", "at least model.moe.experts_per_token=2"]),
    "heads not a multiple": (["--config.model.num_heads=3"], ["'model.num_heads' has value 3",
                                                              "a multiple of model.num_kv_heads=2", "Change model.num_heads"]),
    "kv heads not a divisor": (["--config.model.num_kv_heads=3"], ["'model.num_kv_heads' has value 3",
                                                                   "a divisor of model.num_heads=4"]),
    "unknown choice": (["--config.model.moe.backend=foo"], ["'model.moe.backend'", "dropless | capacity | expert_parallel"]),
    "schedule and mixture file": (['--config.data.schedule=[[0, {"code": 1}]]', "--config.data.mixture_file=m.json"],
                                  ["data.schedule", "data.mixture_file is set", "Set one"]),
    "override then its group": (["--config.model.moe.num_experts=4", '--config.model.moe={"num_experts": 2}'],
                                ["--config.model.moe is provided after --config.model.moe.num_experts", "each key once"]),
}


def _argv(extra, workdir):
    if extra is None:  # the config file itself is wrong
        return ["moejax.main", "--config", "nope.py", "--workdir", workdir]
    if isinstance(extra, str):  # a config file with an argument
        return ["moejax.main", "--config", f"experiments/configs/{extra}", "--workdir", workdir]
    # A short run, in case a mistake were ever accepted (given last: the rows' own values come first).
    return ["moejax.main", "--config", CONFIG, "--workdir", workdir, *extra, "--config.train.steps=2",
            "--config.optim.warmup_steps=1"]


@pytest.mark.parametrize("name", list(CASES))
def test_mistake_ends_in_one_paragraph_naming_the_key_and_the_fix(name, tmp_path, capsys):
    extra, expected = CASES[name]
    with pytest.raises(SystemExit) as stop:  # any other exception would be a traceback
        main(_argv(extra, str(tmp_path / "run")))
    assert stop.value.code == 2
    err = capsys.readouterr().err
    lines = [line for line in err.splitlines() if line.strip()]
    assert len(lines) == 1 and lines[0].startswith("moejax: error: "), err
    for fragment in expected:
        assert fragment in lines[0], f"{fragment!r} not in: {lines[0]}"
    assert not (tmp_path / "run").exists()  # nothing was started


@pytest.mark.parametrize("name", ["leaf typo", "bad JSON mixture", "heads not a multiple"])
def test_the_terminal_sees_no_traceback(name, tmp_path):
    extra, expected = CASES[name]
    out = subprocess.run([sys.executable, "-m", *_argv(extra, str(tmp_path / "run"))], capture_output=True,
                         text=True, timeout=240)
    assert out.returncode == 2
    assert "Traceback" not in out.stderr and out.stdout == ""
    assert out.stderr.startswith("moejax: error: ") and out.stderr.count("\n") == 1
    assert all(fragment in out.stderr for fragment in expected)


def test_mixture_overrides_for_any_domains(tmp_path):
    """Per-domain weights tweak the experiment's mixture; naming a domain it lacks starts a new one;
    JSON text replaces it. (The domains themselves are checked against the dataset at start.)"""
    from moejax.config import apply_mixture_overrides, default_config

    tweaked = apply_mixture_overrides(default_config(), [("code", "0.5")])
    assert dict(tweaked.data.mixture) == {"code": 0.5, "prose": 0.25, "math": 0.25, "knowledge": 0.25}
    new = apply_mixture_overrides(default_config(), [("recipes", "0.4"), ("logs", "0.6")])
    assert dict(new.data.mixture) == {"recipes": 0.4, "logs": 0.6}
    text = apply_mixture_overrides(default_config(), [(None, '{"chat": 1, "logs": 3}'), ("chat", "2")])
    assert dict(text.data.mixture) == {"chat": 2.0, "logs": 3.0}


def test_mixture_warning_points_at_the_callers_line():
    """Not at a line of library source (the stray line under the message in the terminal)."""
    import warnings

    from moejax.data.mixture import MixtureWarning, schedule_from_config
    from moejax.config import default_config

    cfg = default_config()
    cfg.data.mixture = {"code": 3.0, "math": 1.0}
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        schedule_from_config(cfg.data, ("code", "prose", "math", "knowledge"), "the built-in corpus")
    (warning,) = [w for w in caught if issubclass(w.category, MixtureWarning)]
    assert warning.filename == __file__
    assert "weights sum to 4, not 1; normalised to {code: 0.75, math: 0.25}" in str(warning.message)


def test_paths_on_the_command_line_mean_what_the_user_typed(tmp_path, monkeypatch):
    """'~' is expanded in path flags and path config keys; relative ones resolve where the user ran
    launch.sh (MOEJAX_CALLER_CWD), while paths written in the experiment file keep their meaning."""
    import os

    import moejax
    from moejax.main import parse_command_line

    command = parse_command_line(["moejax.main", "--config", CONFIG, "--workdir", "~/runs/x",
                                  "--config.data.path=~/ds", "--config.data.cache_dir=~/cache"])
    assert command.workdir == os.path.expanduser("~/runs/x")
    assert command.config.data.path == os.path.expanduser("~/ds")
    assert command.config.data.cache_dir == os.path.expanduser("~/cache")
    monkeypatch.setattr(moejax, "CALLER_CWD", str(tmp_path))
    command = parse_command_line(["moejax.main", "--config", CONFIG, "--workdir", "mine",
                                  "--config.data.mixture_file=m.json", "--config.data.schedule=[[0, {\"code\": 1}]]"])
    assert command.workdir == str(tmp_path / "mine")  # the experiment file itself is the repository's
    assert command.config.data.mixture_file == str(tmp_path / "m.json")
    assert command.config.data.schedule == '[[0, {"code": 1}]]'  # JSON text is not a path
