"""How much the commands say: library code logs (moejax.log), every command line takes -q/--quiet
and -v/--verbose.

By default a command shows INFO and up, on stdout where its progress lines always were, with
warnings and errors on stderr; --quiet keeps only warnings and errors, --verbose adds debug
messages. Checked on the handler, on every command's options, and end to end on a short training
run, whose result line stays on stdout at any verbosity.
"""

from __future__ import annotations

import logging

import pytest

from moejax.log import setup_logging


@pytest.mark.parametrize("verbosity, shown", [(-1, ""), (0, "I"), (1, "DI")])
def test_verbosity_picks_the_levels_and_warnings_go_to_stderr(verbosity, shown, capsys):
    setup_logging(verbosity)
    for name in ("moejax.train.loop", "data_mixture.sweep.runner"):
        logger = logging.getLogger(name)
        logger.debug("D")
        logger.info("I")
        logger.warning("W")
    out, err = capsys.readouterr()
    assert out == "".join(f"{level}\n" for level in shown) * 2
    assert err == "W\n" * 2


def test_a_second_setup_replaces_the_first(capsys):
    setup_logging(-1)
    setup_logging(0)
    logging.getLogger("moejax.eval").info("once")
    assert capsys.readouterr().out == "once\n"


def _argparse_commands():
    from data_mixture.__main__ import COMMANDS
    from data_mixture.__main__ import main as data_mixture_main
    from moejax.data import export, l3_alloc, prepare
    from moejax.eval.__main__ import main as eval_main
    from moejax.generate import main as generate_main
    from moejax.interop.hf import main as hf_main

    commands = {"eval": (eval_main, []), "generate": (generate_main, []), "prepare": (prepare.main, []),
                "export": (export.main, []), "l3-alloc": (l3_alloc.main, []), "hf import": (hf_main, ["import"]),
                "hf export": (hf_main, ["export"])}
    commands.update({f"data-mixture {name}": (data_mixture_main, [name]) for name in COMMANDS})
    return [pytest.param(main, argv, id=name) for name, (main, argv) in commands.items()]


@pytest.mark.parametrize("main, argv", _argparse_commands())
def test_every_command_offers_quiet_and_verbose(main, argv, capsys):
    with pytest.raises(SystemExit) as exit_:
        main([*argv, "--help"])
    out = capsys.readouterr().out
    assert exit_.value.code == 0
    assert "-q, --quiet" in out and "-v, --verbose" in out


def test_quiet_and_verbose_together_are_refused(capsys):
    from data_mixture.__main__ import main

    with pytest.raises(SystemExit) as exit_:
        main(["fit", "--runs", "r.csv", "--law", "camel", "--out", "f.json", "-q", "-v"])
    assert exit_.value.code == 2
    assert "not allowed with argument" in capsys.readouterr().err


def test_training_command_line_parses_quiet_and_verbose(tmp_path, capsys):
    from moejax.main import parse_command_line

    argv = ["moejax", "--config", "experiments/tiny_moe.py", "--workdir", str(tmp_path / "run")]
    assert parse_command_line(argv).verbosity == 0
    assert parse_command_line([*argv, "-q"]).verbosity == -1
    assert parse_command_line([*argv, "--verbose"]).verbosity == 1
    with pytest.raises(SystemExit) as exit_:
        parse_command_line([*argv, "--quiet", "-v"])
    assert exit_.value.code == 2
    assert "moejax: error: --verbose and --quiet ask for opposite things" in capsys.readouterr().err


TINY = ["--config.train.log_every=1", "--config.train.eval_every=2", "--config.checkpoint.every_steps=2",
        "--config.optim.warmup_steps=1", "--config.train.seq_len=32", "--config.train.global_batch_size=8",
        "--config.train.eval_batches=1", "--config.model.d_model=32", "--config.model.num_layers=1",
        "--config.model.mlp_dim=64", "--config.model.moe.expert_dim=32", "--config.model.moe.shared_expert_dim=32"]


def test_training_says_more_with_verbose_and_only_its_result_with_quiet(tmp_path, corpus_cache, capsys):
    from moejax.main import main

    argv = ["moejax", "--config", "experiments/tiny_moe.py", "--workdir", str(tmp_path / "run"), *TINY,
            f"--config.data.cache_dir={corpus_cache}"]
    main([*argv, "--config.train.steps=2", "--verbose"])
    out = capsys.readouterr().out
    assert "moejax: compilation cache " in out and "moejax: saving checkpoint 2 " in out  # debug
    assert "moejax: training (the steps compiled in" in out and "step=1 loss=" in out  # info
    assert out.splitlines()[-1].startswith("done: step 2, ")

    main([*argv, "--config.train.steps=4", "-q"])  # resumes at step 2 and trains two more steps
    out, err = capsys.readouterr()
    (line,) = out.splitlines()  # no progress lines, no per-step lines
    assert line.startswith("done: step 4 (resumed from step 2), ")
    assert "moejax: " not in err and "step=" not in err
