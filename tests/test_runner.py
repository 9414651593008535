"""``moejax.runner.run``: how every command starts (one-paragraph errors with exit 2, Ctrl-C with
130, success 0), and the error kinds it catches by their common base class."""

import pytest

from moejax.errors import ConfigError, UserError
from moejax.runner import run


def _fail(error):
    def body():
        raise error
    return body


def test_success_returns_0_and_the_body_may_give_its_own_code():
    assert run(lambda: None, prog="tool") == 0
    with pytest.raises(SystemExit) as stop:
        run(lambda: 3, prog="tool")
    assert stop.value.code == 3


def test_a_user_error_is_one_paragraph_and_exit_2(capsys):
    with pytest.raises(SystemExit) as stop:
        run(_fail(ConfigError("config key 'train.steps' has value 0; allowed: a positive value.")), prog="moejax")
    assert stop.value.code == 2
    assert capsys.readouterr().err == "moejax: error: config key 'train.steps' has value 0; allowed: a positive value.\n"


def test_a_missing_file_is_a_user_error_only_where_the_command_says_so(capsys):
    with pytest.raises(SystemExit) as stop:
        run(_fail(FileNotFoundError(2, "No such file", "runs.csv")), prog="dm fit", errors=(FileNotFoundError,))
    assert stop.value.code == 2 and capsys.readouterr().err == "dm fit: error: file not found: runs.csv\n"
    with pytest.raises(FileNotFoundError):  # a bug elsewhere stays a traceback
        run(_fail(FileNotFoundError(2, "No such file", "x")), prog="tool")


def test_ctrl_c_is_one_line_and_exit_130_when_the_command_says_what_was_kept(capsys):
    with pytest.raises(SystemExit) as stop:
        run(_fail(KeyboardInterrupt()), prog="prepare", interrupted="interrupted; the shards so far are kept.")
    assert stop.value.code == 130 and capsys.readouterr().err == "prepare: interrupted; the shards so far are kept.\n"
    with pytest.raises(KeyboardInterrupt):
        run(_fail(KeyboardInterrupt()), prog="tool")


def test_every_input_error_of_moejax_and_data_mixture_is_a_user_error():
    """Caught by the class, not looked up by name: a renamed or new kind is caught as long as it
    subclasses UserError (as each of these does)."""
    from data_mixture.cli.flags import UsageError
    from data_mixture.collect import CollectError
    from data_mixture.evaluate import EvaluateError
    from data_mixture.fit import FitFileError
    from data_mixture.mergemix.experts import MergeMixError
    from data_mixture.mergemix.merge import MergeMismatch
    from data_mixture.mergemix.objective import SearchError
    from data_mixture.optimize import OptimizeError
    from data_mixture.plan import PlanError
    from data_mixture.register import RegistrationError
    from data_mixture.solver import FixedError
    from data_mixture.sweep.targets import SweepError
    from data_mixture.table import TableError
    from moejax.errors import DataError
    from moejax.eval.tasks import TaskFileError
    from moejax.interop.hf.errors import InteropError
    from moejax.train.checkpoint import CheckpointMismatch

    kinds = (UsageError, CollectError, EvaluateError, FitFileError, MergeMixError, MergeMismatch, SearchError,
             OptimizeError, PlanError, RegistrationError, FixedError, SweepError, TableError, DataError, TaskFileError, InteropError,
             CheckpointMismatch, ConfigError)
    assert [k.__name__ for k in kinds if not issubclass(k, UserError)] == []
