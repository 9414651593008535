"""moejax as an installed package: the wheel's console scripts, launch.sh's checks of a Python.

- The wheel (built from this checkout without a network) installed into a venv outside the
  repository gives ``moejax`` and ``data-mixture`` commands that find the built-in configs by name.
  The venv borrows this environment's packages (a ``.pth`` line) so that no download is needed;
  the slow test installs the wheel for real, with its declared dependencies from the pins and no
  torch, and trains the default config a few steps.
- launch.sh refuses a Python older than pyproject.toml's requires-python, and an environment given
  by ``MOEJAX_PYTHON`` that lacks packages or holds them at other versions than constraints.txt,
  naming them.
- pyproject.toml and constraints.txt agree: every requirement is pinned, within its range.
"""

from __future__ import annotations

import os
import re
import shutil
import site
import subprocess
import sys
import tomllib
from pathlib import Path

import pytest

from moejax import envcheck

ROOT = Path(__file__).resolve().parents[1]
TRAIN_ENV = {"JAX_PLATFORMS": "cpu"}


def _clean_env(**extra: str) -> dict[str, str]:
    """The environment of a command run as a user would: no PYTHONPATH, nothing preloaded."""
    env = {k: v for k, v in os.environ.items()
           if k not in ("PYTHONPATH", "LD_PRELOAD", "MOEJAX_PYTHON", "MOEJAX_CHECK_PINS", "VIRTUAL_ENV")}
    env.update(extra)
    return env


def _build_wheel(out: Path) -> Path:
    """The wheel of this checkout, built from a copy of its package sources (no build/ or
    egg-info left in the repository), without build isolation: no download."""
    pytest.importorskip("setuptools", reason="the dev extra installs setuptools to build the wheel")
    src = out / "src"
    src.mkdir()
    for name in ("pyproject.toml", "README.md"):
        shutil.copy(ROOT / name, src / name)
    ignore = shutil.ignore_patterns("__pycache__", "*.pyc", "results", "notebooks")
    for package in ("moejax", "data_mixture"):
        shutil.copytree(ROOT / package, src / package, ignore=ignore)
    subprocess.run([sys.executable, "-m", "pip", "wheel", "--quiet", "--no-deps", "--no-build-isolation",
                    "--no-index", "-w", str(out / "dist"), str(src)], check=True, env=_clean_env())
    (wheel,) = (out / "dist").glob("moejax-*.whl")
    return wheel


def _venv(path: Path, *, with_pip: bool) -> Path:
    subprocess.run([sys.executable, "-m", "venv", *([] if with_pip else ["--without-pip"]), str(path)], check=True)
    return path / "bin" / "python"


@pytest.fixture(scope="module")
def installed(tmp_path_factory) -> Path:
    """A venv outside the repository with the wheel installed (no dependencies), which sees this
    environment's packages through a .pth line; returns its bin directory."""
    out = tmp_path_factory.mktemp("wheel")
    wheel = _build_wheel(out)
    python = _venv(out / "venv", with_pip=False)
    purelib = subprocess.run([str(python), "-c", "import sysconfig; print(sysconfig.get_paths()['purelib'])"],
                             check=True, capture_output=True, text=True).stdout.strip()
    (Path(purelib) / "borrowed.pth").write_text("\n".join(site.getsitepackages()) + "\n")
    subprocess.run([sys.executable, "-m", "pip", "--python", str(python), "install", "--quiet", "--no-deps",
                    "--no-index", str(wheel)], check=True, env=_clean_env())
    return out / "venv" / "bin"


def _run(bin_dir: Path, command: str, *args: str, cwd: Path, **env: str) -> subprocess.CompletedProcess:
    return subprocess.run([str(bin_dir / command), *args], cwd=cwd, capture_output=True, text=True, timeout=300,
                          env=_clean_env(**TRAIN_ENV, **env))


def test_installed_package_is_the_wheels_not_the_checkouts(installed, tmp_path):
    done = subprocess.run([str(installed / "python"), "-c", "import moejax, data_mixture, moejax.configs as c; "
                           "print(moejax.__file__); print(data_mixture.__file__); print(c.path('tiny_moe'))"],
                          cwd=tmp_path, capture_output=True, text=True, check=True, env=_clean_env())
    paths = done.stdout.split()
    assert len(paths) == 3 and all(p.startswith(str(installed.parent)) for p in paths), done.stdout
    assert Path(paths[2]).is_file()


def test_moejax_command_lists_its_commands_and_configs(installed, tmp_path):
    done = _run(installed, "moejax", "--help", cwd=tmp_path)
    assert done.returncode == 0, done.stderr
    for command in ("train", "eval", "generate", "prepare", "hf", "configs"):
        assert re.search(rf"^\s+{command}\s", done.stdout, re.M), done.stdout
    done = _run(installed, "moejax", "configs", cwd=tmp_path)
    assert done.returncode == 0 and "tiny_moe" in done.stdout and str(installed.parent) in done.stdout
    done = _run(installed, "moejax", "trian", cwd=tmp_path)
    assert done.returncode == 2 and "unknown command 'trian'. Did you mean 'train'?" in done.stderr


def test_every_command_module_is_in_the_wheel(installed, tmp_path):
    """Each subcommand's module imports from the installed package (cheap: no --help round trips
    through jax for each)."""
    code = ("import importlib.util, sys; from moejax.cli import COMMANDS; "
            "missing = [m for m, _ in COMMANDS.values() if m and importlib.util.find_spec(m) is None]; "
            "sys.exit(f'missing: {missing}' if missing else 0)")
    done = subprocess.run([str(installed / "python"), "-c", code], cwd=tmp_path, capture_output=True, text=True,
                          env=_clean_env())
    assert done.returncode == 0, done.stderr


def test_moejax_train_finds_a_builtin_config_by_name_anywhere(installed, tmp_path):
    """From a directory that is not the repository: ``tiny_moe``, ``experiments/configs/tiny_moe.py``
    and the old ``experiments/tiny_moe.py`` all load the packaged config (the override's bad value
    is then reported against it, before anything is compiled), and ``tiny_moe:arg`` calls its
    get_config."""
    for config in ("tiny_moe", "experiments/configs/tiny_moe.py", "experiments/tiny_moe.py"):
        done = _run(installed, "moejax", "train", config, "--config.train.steps=abc", cwd=tmp_path)
        assert done.returncode == 2, done.stderr
        assert "'train.steps' takes an integer" in done.stderr and "Traceback" not in done.stderr
    done = _run(installed, "moejax", "train", "tiny_moe:foo", cwd=tmp_path)
    assert done.returncode == 2
    assert "get_config() takes 0 positional arguments" in done.stderr
    assert str(installed.parent) in done.stderr  # the packaged file, named in the message
    done = _run(installed, "moejax", "train", "nope", cwd=tmp_path)
    assert done.returncode == 2
    # Named as the absolute path it was looked for at (relative paths resolve against the caller's directory).
    assert f"config file '{tmp_path / 'nope'}' not found" in done.stderr
    assert "tiny_moe, small_moe, deepseek_16b" in done.stderr
    assert not (tmp_path / "runs").exists()


def test_data_mixture_command(installed, tmp_path):
    done = _run(installed, "data-mixture", "--help", cwd=tmp_path)
    assert done.returncode == 0, done.stderr
    for command in ("fit", "optimize", "sweep", "mergemix"):
        assert command in done.stdout


@pytest.mark.slow
def test_base_install_from_the_wheel_trains_without_torch(tmp_path):
    """``pip install moejax.whl`` (the base, pinned by constraints.txt) into a fresh venv outside
    the repository, then ``moejax train tiny_moe``: no torch, Ray or pytest installed. Downloads
    the dependencies unless pip's cache has them."""
    wheel = _build_wheel(tmp_path)
    python = _venv(tmp_path / "venv", with_pip=True)
    subprocess.run([str(python), "-m", "pip", "install", "--quiet", "-c", str(ROOT / "constraints.txt"), str(wheel)],
                   check=True, env=_clean_env())
    subprocess.run([str(python), "-m", "pip", "check"], check=True, env=_clean_env())
    absent = subprocess.run([str(python), "-c", "import importlib.util as u; print([m for m in ('torch', 'ray', "
                             "'pytest', 'transformers') if u.find_spec(m)])"], capture_output=True, text=True,
                            check=True).stdout.strip()
    assert absent == "[]"
    work = tmp_path / "elsewhere"
    work.mkdir()
    done = _run(python.parent, "moejax", "train", "tiny_moe", "--config.train.steps=3", "--config.train.eval_every=3",
                cwd=work)
    assert done.returncode == 0, done.stderr[-3000:]
    assert "done: step 3" in done.stdout
    assert (work / "runs" / "tiny_moe" / "checkpoints" / "3").is_dir()


# ----------------------------------------------------------------------------------- launch.sh


def _launcher(tmp_path: Path) -> Path:
    """launch.sh with the files its Python checks read, in a directory of its own (no .venv)."""
    home = tmp_path / "checkout"
    (home / "moejax").mkdir(parents=True)
    for name in ("launch.sh", "pyproject.toml", "constraints.txt", "moejax/envcheck.py", "moejax/allocator.py"):
        shutil.copy(ROOT / name, home / name)
    return home / "launch.sh"


def _fake_python(path: Path, version: str) -> Path:
    """A stand-in for an old Python: answers launch.sh's version question with ``version``."""
    path.write_text("#!/bin/sh\ncase \"$2\" in\n  *print*) echo %s ;;\n  *) exit 1 ;;\nesac\n" % version)
    path.chmod(0o755)
    return path


@pytest.mark.parametrize("variable", ["MOEJAX_BASE_PYTHON", "MOEJAX_PYTHON"])
def test_launch_sh_refuses_an_old_python(tmp_path, variable):
    launch = _launcher(tmp_path)
    old = _fake_python(tmp_path / "python3.10", "3.10.12")
    done = subprocess.run(["bash", str(launch), "python", "-c", "print(1)"], capture_output=True, text=True,
                          env=_clean_env(**{variable: str(old)}), timeout=60)
    assert done.returncode == 2
    assert f"moejax needs Python 3.11 or newer (jax 0.10 does); {variable} ({old}) is Python 3.10.12" in done.stderr
    assert not (launch.parent / ".venv" / "bin").exists()


def test_launch_sh_names_what_a_moejax_python_environment_lacks(tmp_path):
    """An environment without jax and with another numpy: the message names both and the fix;
    MOEJAX_CHECK_PINS=warn runs the command anyway."""
    launch = _launcher(tmp_path)
    python = _venv(tmp_path / "env", with_pip=False)
    purelib = Path(subprocess.run([str(python), "-c", "import sysconfig; print(sysconfig.get_paths()['purelib'])"],
                                  check=True, capture_output=True, text=True).stdout.strip())
    pins = envcheck.pins(str(ROOT / "constraints.txt"))
    fakes = {"numpy": "1.26.4", "flax": pins["flax"], "torch": pins["torch"] + "+cu128"}
    for name, version in fakes.items():
        info = purelib / f"{name}-{version}.dist-info"
        info.mkdir()
        (info / "METADATA").write_text(f"Metadata-Version: 2.1\nName: {name}\nVersion: {version}\n")
    env = _clean_env(MOEJAX_PYTHON=str(python))
    done = subprocess.run(["bash", str(launch), "python", "-c", "print('ran')"], capture_output=True, text=True,
                          env=env, timeout=60)
    assert done.returncode == 2 and "ran" not in done.stdout
    message = done.stderr
    assert f"launch.sh: error: the environment of MOEJAX_PYTHON ({python})" in message
    missing = re.search(r"missing: ([^;.]*)", message).group(1).split(", ")
    assert {"jax", "jaxlib", "optax", "orbax-checkpoint"} <= set(missing) and "flax" not in missing
    assert f"at the wrong version: numpy 1.26.4 (pinned {pins['numpy']})" in message
    assert "flax " not in message.split("wrong version")[1]
    assert "-m pip install -c constraints.txt -e '.'" in message and "MOEJAX_CHECK_PINS=warn" in message

    # The test suite needs the dev extra: torch at the pinned release, whatever its build.
    done = subprocess.run(["bash", str(launch), "test"], capture_output=True, text=True, env=env, timeout=60)
    assert done.returncode == 2 and "for the test suite" in done.stderr and "pytest" in done.stderr
    assert "torch" not in done.stderr

    done = subprocess.run(["bash", str(launch), "python", "-c", "print('ran')"], capture_output=True, text=True,
                          env={**env, "MOEJAX_CHECK_PINS": "warn"}, timeout=60)
    assert done.returncode == 0 and done.stdout.strip() == "ran"
    assert "missing: " in done.stderr and "running anyway" in done.stderr


def test_launch_sh_accepts_this_environment_when_it_is_at_the_pins(tmp_path):
    missing, wrong = envcheck.problems([])
    if missing or wrong:
        pytest.skip(f"this environment is not at the pins: {missing} {wrong}")
    done = subprocess.run(["bash", str(_launcher(tmp_path)), "python", "-c", "print('ran')"], capture_output=True,
                          text=True, env=_clean_env(MOEJAX_PYTHON=sys.executable), timeout=120)
    assert done.returncode == 0 and done.stdout.strip() == "ran", done.stderr


# ------------------------------------------------------------------------- the pins themselves


def test_every_requirement_is_pinned_within_its_range():
    from packaging.requirements import Requirement

    extras = list(tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]["optional-dependencies"])
    pins = envcheck.pins(str(ROOT / "constraints.txt"))
    for name, text in envcheck.requirements(extras).items():
        assert name in pins, f"{name} ({text}) has no pin in constraints.txt"
        assert Requirement(text).specifier.contains(pins[name], prereleases=True), (text, pins[name])


def test_launch_sh_and_pyproject_agree_on_the_python_version():
    requires = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]["requires-python"]
    minimum = re.search(r"^MIN_PYTHON=(\S+)", (ROOT / "launch.sh").read_text(), re.M).group(1)
    assert requires == f">={minimum}"
    assert sys.version_info[:2] >= tuple(map(int, minimum.split(".")))


def test_a_local_version_label_meets_its_pin(monkeypatch):
    pins = envcheck.pins()
    builds = {"torch": pins["torch"] + "+cpu", "transformers": pins["transformers"]}
    monkeypatch.setattr(envcheck, "requirements", lambda extras: {n: n for n in builds})
    monkeypatch.setattr(envcheck.importlib.metadata, "version", lambda name: builds[name])
    assert envcheck.problems(["hf"]) == ([], [])
    builds["torch"] = "2.0.0+cpu"
    assert envcheck.problems(["hf"]) == ([], [f"torch 2.0.0+cpu (pinned {pins['torch']})"])


def test_the_base_install_has_no_torch_ray_or_pytest():
    base = envcheck.requirements([])
    assert not {"torch", "transformers", "ray", "pytest", "pyarrow", "jupyterlab"} & set(base)
    assert {"jax", "etils", "cmeel-mimalloc" if sys.platform == "linux" else "jax"} <= set(base)


def test_an_extra_left_out_is_named_when_it_is_needed(tmp_path, monkeypatch):
    """Without pyarrow (the parquet extra) or Ray (the sweep extra), the command that needs it says
    which extra to install, in one paragraph."""
    from data_mixture.sweep.ray_backend import RayBackend
    from data_mixture.sweep.targets import SweepError
    from moejax.data import sources
    from moejax.errors import DataError

    monkeypatch.setitem(sys.modules, "pyarrow", None)
    monkeypatch.setitem(sys.modules, "pyarrow.parquet", None)
    with pytest.raises(DataError, match=r"reading Parquet needs pyarrow.*pip install 'moejax\[parquet\]'"):
        sources._parquet_file(tmp_path / "docs.parquet", "text")
    monkeypatch.setitem(sys.modules, "ray", None)
    with pytest.raises(SweepError, match=r"--backend ray needs Ray.*pip install 'moejax\[sweep\]'"):
        RayBackend(address=None, cpus_per_run=1, gpus_per_run=0, parallel=1)
