"""``moejax.config.load``: the library call that turns an experiment file plus overrides into a
config, raising ``ConfigError`` (never exiting, never printing), safe from several threads."""

import threading

import pytest

from moejax.config import default_config, load
from moejax.errors import ConfigError

TINY = "experiments/configs/tiny_moe.py"


def test_overrides_as_strings_or_a_mapping_give_the_same_config_and_the_keys_set():
    by_text, changed = load(TINY, ["train.steps=20", "--config.optim.lr=0.01", "data.mixture.code=0.5",
                                   "model.moe.balancing=(('z_loss', {'weight': 0.001}),)"])
    assert changed == ("train.steps", "optim.lr", "model.moe.balancing", "data.mixture.code")
    by_value, _ = load(TINY, {"train.steps": 20, "optim.lr": 0.01, "data.mixture.code": "0.5",
                              "model.moe.balancing": (("z_loss", {"weight": 0.001}),)})
    assert by_text.to_dict() == by_value.to_dict()
    assert by_text.train.steps == 20 and by_text.optim.lr == 0.01 and by_text.data.mixture.code == 0.5
    assert by_text.model.moe.balancing == (("z_loss", {"weight": 0.001}),)


def test_a_built_in_name_loads_the_built_in_file():
    assert load("tiny_moe")[0].to_dict() == load(TINY)[0].to_dict()


def test_a_bad_key_raises_config_error_with_the_one_paragraph_message(capsys):
    with pytest.raises(ConfigError) as error:
        load(TINY, ["train.step=20"])
    message = str(error.value)
    assert message.startswith("--config.train.step=20: unknown config key 'train.step'")
    assert 'Did you mean "steps" (--config.train.steps)?' in message and "\n" not in message
    with pytest.raises(ConfigError, match=r"flag --config.model.num_layers=2.5: config key 'model.num_layers' "
                                          r"takes an integer; e\.g\. --config.model.num_layers=4"):
        load(TINY, {"model.num_layers": 2.5})
    with pytest.raises(ConfigError, match="config file 'nope.py' not found"):
        load("nope.py")
    assert capsys.readouterr() == ("", "")  # a library call prints nothing


def test_a_get_config_returning_a_dict_lays_its_keys_over_the_defaults(tmp_path):
    """A plain dict of the keys a file changes is accepted; its mistakes name the key."""
    good = tmp_path / "changes.py"
    good.write_text("def get_config():\n    return {'train': {'steps': 30}, 'data': {'mixture': {'code': 1.0}}}\n")
    cfg, _ = load(str(good))
    expected = default_config()
    expected.train.steps = 30
    assert cfg.train.steps == 30 and dict(cfg.data.mixture) == {"code": 1.0}
    assert cfg.model.to_dict() == expected.model.to_dict()
    typo = tmp_path / "typo.py"
    typo.write_text("def get_config():\n    return {'train': {'step': 30}}\n")
    with pytest.raises(ConfigError, match=r"get_config\(\) returned a dict with unknown config key 'train.step'.*"
                                          r"Did you mean \"steps\""):
        load(str(typo))
    wrong = tmp_path / "wrong.py"
    wrong.write_text("def get_config():\n    return {'train': {'steps': 'many'}}\n")
    with pytest.raises(ConfigError, match=r"config key 'train.steps' has value 'many'; allowed: an integer"):
        load(str(wrong))
    nothing = tmp_path / "nothing.py"
    nothing.write_text("def get_config():\n    pass\n")
    with pytest.raises(ConfigError, match=r"get_config\(\) returned NoneType.*allowed: a ConfigDict.*or a dict"
                                          r".*Did you forget a return statement\?"):
        load(str(nothing))


def test_several_threads_loading_different_files_each_get_their_own(tmp_path):
    """Each file is its own module (no shared module name, no lock): a file without get_config()
    is an error even while other threads load files that have one."""
    files = {}
    for i in range(4):
        path = tmp_path / f"exp{i}.py"
        path.write_text("from moejax.config import default_config\n\n\ndef get_config():\n"
                        f"    cfg = default_config()\n    cfg.train.steps = {100 + i}\n    return cfg\n")
        files[path] = 100 + i
    broken = tmp_path / "broken.py"
    broken.write_text("STEPS = 3\n")
    failures = []

    def work(path, steps):
        for _ in range(20):
            try:
                cfg, _ = load(str(path), [f"train.seed={steps}"])
                if (cfg.train.steps, cfg.train.seed) != (steps, steps):
                    failures.append(f"{path.name}: got steps {cfg.train.steps}, seed {cfg.train.seed}")
            except ConfigError as e:
                failures.append(f"{path.name}: {e}")
            try:
                load(str(broken))
                failures.append("broken.py loaded another file's config")
            except ConfigError as e:
                if "AttributeError" not in str(e):
                    failures.append(f"broken.py: {e}")

    threads = [threading.Thread(target=work, args=item) for item in files.items()]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert failures == []
