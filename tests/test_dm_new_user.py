"""The new user's workflow on their own dataset: a tokenizer of their own (Unigram, with ``<pad>``,
``</s>`` and ``<unk>``), three training corpora and a held-out target corpus. Each step takes what
it needs from the dataset and the plan, nothing set by hand: the model sizes from the tokenizer,
the training and validation-only domains from the plan, the evaluation windows across the whole
held-out split with their standard error."""

from __future__ import annotations

import json
import math

import numpy as np
import pytest

from data_mixture.plan import DEFAULT_PRESETS, PlanError, PlanSpec, make_plan, preset_sizes, split_domains

PRESETS = {k: DEFAULT_PRESETS[k] for k in ("s1", "s2", "s3")}
TRAINED = ("code", "math", "prose")


def user_texts() -> dict[str, list[str]]:
    """Three training corpora and a held-out target corpus (qa), each with words of its own (enough
    of them that the tokenizer's vocabulary exceeds moejax's default of 272)."""
    rng = np.random.default_rng(0)
    syllables = "ka lo mi ne su ta ri po de fa gu hi jo ve zu bre sta kon mar lis".split()
    out = {}
    for d in ("code", "math", "prose", "qa"):
        words = ["".join(rng.choice(syllables, 3)) for _ in range(150)]
        out[d] = [" ".join(rng.choice(words, 80)) for _ in range(120)]
    return out


@pytest.fixture(scope="module")
def dataset(tmp_path_factory) -> str:
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers

    from moejax.data.prepare import prepare_dataset

    root = tmp_path_factory.mktemp("new_user")
    texts = user_texts()
    tok = Tokenizer(models.Unigram())
    tok.pre_tokenizer, tok.decoder = pre_tokenizers.Metaspace(), decoders.Metaspace()
    tok.train_from_iterator([t for v in texts.values() for t in v], trainers.UnigramTrainer(
        vocab_size=700, special_tokens=["<pad>", "</s>", "<unk>"], unk_token="<unk>", show_progress=False))
    (root / "tok").mkdir()
    tok.save(str(root / "tok" / "tokenizer.json"))
    for d, docs in texts.items():
        with open(root / f"{d}.jsonl", "w") as f:
            f.writelines(json.dumps({"text": t}) + "\n" for t in docs)
    out = str(root / "ds")
    prepare_dataset([f"{d}={root / d}.jsonl" for d in texts], out, tokenizer=str(root / "tok"), heldout_fraction=0.2,
                    workers=1, progress=False, seq_len=32)
    return out


def plan_spec(dataset: str, **kw) -> PlanSpec:
    base = dict(budget_flops=3e14, target_size=3e6, target_tokens=6e7, law="regmix_linear", presets=PRESETS,
                dataset=dataset, simulations=1, sim_starts=2, min_runs_per_size=3, max_candidates=2)
    base.update(kw)
    return PlanSpec(**base)


def test_the_tokenizer_pads_with_its_own_pad_token_and_exports_its_unk(dataset):
    from moejax.data import open_dataset

    tok = open_dataset(dataset).tokenizer
    assert (tok.eos_token, tok.pad_token) == ("</s>", "<pad>")  # not </s> for both
    assert tok.pad_id != tok.eos_id
    config = json.loads(open(f"{dataset}/tokenizer_config.json").read())
    assert (config["pad_token"], config["eos_token"], config["unk_token"]) == ("<pad>", "</s>", "<unk>")


def test_plan_sizes_the_models_with_the_dataset_s_vocabulary(dataset):
    from moejax.config import load
    from moejax.data import open_dataset
    from moejax.model.transformer import param_counts

    vocab = open_dataset(dataset).tokenizer.vocab_size
    assert vocab > 272  # the default config's vocabulary
    sizes = preset_sizes(PRESETS, "experiments/configs/tiny_moe.py", dataset)
    default = preset_sizes(PRESETS)
    for name, overrides in PRESETS.items():
        cfg, _ = load("experiments/configs/tiny_moe.py", {**overrides, "model.vocab_size": 128 * math.ceil(vocab / 128)})
        counts = param_counts(cfg.model)
        assert sizes[name] == {"params_total": counts["total"], "params_active": counts["active"]}
        assert sizes[name]["params_active"] > default[name]["params_active"]  # the built-in 272 would undercount
    plan = make_plan(plan_spec(dataset))
    for run in plan["runs"]:
        assert run["params_active"] == sizes[run["preset"]]["params_active"]
        assert run["flops"] == 6 * run["params_active"] * run["tokens"]
        assert run["overrides"]["data.path"] == dataset
    assert plan["total_flops"] <= plan["budget_flops"]


def test_a_held_out_target_is_validation_only_through_the_plan(dataset):
    plan = make_plan(plan_spec(dataset, target="qa"))
    assert plan["mix_domains"] == list(TRAINED) and plan["validation_only"] == ["qa"]
    assert plan["loss_domains"] == ["qa"] and plan["target"]["objective"]["domain"] == "qa"
    assert all(set(r["overrides"]["data.mixture"]) == set(TRAINED) for r in plan["runs"])  # qa gets weight 0
    assert plan["prior"]["heldout_target"]
    # a weighted set of trained domains stays trained; --domains decides; an explicit --validation-only too
    assert split_domains(plan_spec(dataset, target="code=0.5,prose=0.5")) == (("code", "math", "prose", "qa"), ())
    assert split_domains(plan_spec(dataset, target="qa", validation_only=())) == (("code", "math", "prose", "qa"), ())
    assert split_domains(plan_spec(None, domains="code,prose,math", target="heldout_qa")) == (
        ("code", "prose", "math"), ("heldout_qa",))
    with pytest.raises(PlanError, match="--validation-only nope: not a domain of dataset .*its domains: code, math, prose, qa"):
        split_domains(plan_spec(dataset, validation_only=("nope",)))


def test_a_held_out_target_of_the_built_in_corpus_is_planned_not_refused():
    plan = make_plan(plan_spec(None, domains="code,prose,math", target="heldout_qa"))
    assert plan["validation_only"] == ["heldout_qa"] and plan["mix_domains"] == ["code", "prose", "math"]


def test_a_plan_that_evaluate_cannot_check_says_so(dataset):
    two = make_plan(plan_spec(dataset, presets={k: PRESETS[k] for k in ("s1", "s2")}))
    assert len(two["chosen"]["sizes"]) == 2
    (warning,) = two["warnings"]
    assert "cannot be checked by `evaluate` or `recommend`" in warning and "--min-sizes 3" in warning
    three = make_plan(plan_spec(dataset, min_sizes=3, budget_flops=2e15))
    assert len(three["chosen"]["sizes"]) == 3 and three["warnings"] == []


def test_a_law_refusing_a_table_with_an_untrained_domain_points_to_validation_only():
    from data_mixture.laws import get_law
    from data_mixture.table import TableError, from_columns

    rng = np.random.default_rng(0)
    w = rng.dirichlet(np.ones(3), 6)
    cols = {"run": [f"r{i}" for i in range(6)], "params_total": [1e6] * 3 + [2e6] * 3, "params_active": [1e6] * 6,
            "tokens": [2e7] * 6, **{f"mix:{d}": list(w[:, j]) for j, d in enumerate(TRAINED)}, "mix:qa": [0.0] * 6,
            "loss:qa": list(3 + rng.random(6))}
    with pytest.raises(TableError, match=r"mix:qa is 0 in every run: .* Collect the runs with --validation-only qa"):
        get_law("camel").check(from_columns(cols), "qa", "params_total")


def test_evaluation_windows_are_sampled_across_the_held_out_split(dataset):
    from moejax.data import make_eval_batches, open_dataset
    from moejax.data.pipeline import eval_window_indices

    ds = open_dataset(dataset)
    first = make_eval_batches(["qa"], seq_len=32, batch_size=4, batches_per_domain=2, dataset=ds, windows="first")
    sampled = make_eval_batches(["qa"], seq_len=32, batch_size=4, batches_per_domain=2, dataset=ds)
    again = make_eval_batches(["qa"], seq_len=32, batch_size=4, batches_per_domain=2, dataset=ds)
    assert all(np.array_equal(a["inputs"], b["inputs"]) for a, b in zip(sampled["qa"], again["qa"]))  # fixed
    assert not all(np.array_equal(a["inputs"], b["inputs"]) for a, b in zip(first["qa"], sampled["qa"]))
    picked = eval_window_indices(100, 8, "qa")
    assert len(set(picked.tolist())) == 8 and picked.max() >= 50
    assert list(eval_window_indices(100, 4, "qa")) == list(picked[:4])  # fewer batches read a prefix
    assert list(eval_window_indices(100, 8, "qa", "first")) == list(range(8))
    assert list(eval_window_indices(5, 8, "qa")) == list(range(5))


def test_a_saved_config_without_the_key_evaluates_as_before():
    from moejax.config import default_config, from_dict, to_dict

    saved = to_dict(default_config())
    assert from_dict(saved).train.eval_windows == "sampled"
    del saved["train"]["eval_windows"]  # a config.json written before the key
    assert from_dict(saved).train.eval_windows == "first"


def test_the_evaluation_reports_its_own_standard_error():
    from moejax.eval.losses import loss_standard_error

    nats, tokens = np.array([30.0, 36.0, 27.0, 40.0]), np.array([10.0, 12.0, 10.0, 10.0])
    loss = nats.sum() / tokens.sum()
    expected = math.sqrt(np.sum((nats - loss * tokens) ** 2) / (4 * 3)) / tokens.mean()
    rows = np.stack([np.append(nats, 0.0), np.append(tokens, 0.0)], 1)  # a padding row: left out
    assert loss_standard_error(rows) == pytest.approx(expected)
    assert loss_standard_error(rows[:1]) is None


# ------------------------------------------------------------------- the walk, plan to training

TINY = {"t1": {"model.d_model": 16, "model.num_layers": 1, "model.num_heads": 1, "model.num_kv_heads": 1,
               "model.head_dim": 16, "model.mlp_dim": 32, "model.moe.expert_dim": 16, "model.moe.shared_expert_dim": 16},
        "t2": {"model.d_model": 24, "model.num_layers": 1, "model.num_heads": 1, "model.num_kv_heads": 1,
               "model.head_dim": 24, "model.mlp_dim": 48, "model.moe.expert_dim": 24, "model.moe.shared_expert_dim": 24},
        "t3": {"model.d_model": 32, "model.num_layers": 1, "model.num_heads": 2, "model.num_kv_heads": 1,
               "model.head_dim": 16, "model.mlp_dim": 64, "model.moe.expert_dim": 32, "model.moe.shared_expert_dim": 32}}


def _plan_cli(dataset: str, out, presets, capsys) -> tuple[dict, str]:
    """``plan`` as the user types it: their dataset, their target (a held-out corpus), their target
    model and budget; sizes, domains and tokens per run come from the dataset and the plan."""
    from data_mixture.__main__ import main as dm_main

    dm_main(["plan", "--dataset", dataset, "--target", "qa", "--budget-flops", "3e9", "--target-size", "2e5",
             "--target-tokens", "4e5", "--presets", json.dumps(presets), "--law", "regmix_linear", "--tokens-per-param",
             "0.05", "--batch", "8", "--seq-len", "32", "--min-sizes", "3", "--min-runs-per-size", "4",
             "--simulations", "1", "--sim-starts", "2", "--out", str(out), "-q"])
    return json.loads(out.read_text()), capsys.readouterr().out


def _recommend_cli(runs_csv: str, plan: dict, out, capsys) -> tuple[list[str], dict]:
    """``recommend`` with everything it needs read from the plan (target, size, tokens, dataset)."""
    import shlex

    from data_mixture.__main__ import main as dm_main

    target = plan["target"]
    dm_main(["recommend", "--runs", runs_csv, "--target", target["objective"]["text"], "--size", repr(target["size"]),
             "--size-column", target["size_column"], "--tokens", repr(target["tokens"]), "--dataset", plan["dataset"],
             "--laws", "regmix_linear", "--bootstrap", "4", "--starts", "2", "--resamples", "100", "--out", str(out), "--no-progress", "-q"])
    printed = capsys.readouterr().out
    line = next(x for x in printed.splitlines() if x.startswith("train with: "))
    return shlex.split(line[len("train with: "):]), json.loads((out / "mixture.json").read_text())


def _check_command(command: list[str], plan: dict, mixture: dict) -> None:
    from moejax.commands import LAUNCH_SCRIPT

    assert command[0] == str(LAUNCH_SCRIPT)  # runs from any directory
    args = dict(a.split("=", 1) for a in command if a.startswith("--config."))
    assert args["--config.data.path"] == plan["dataset"]
    assert int(args["--config.train.steps"]) == math.ceil(plan["target"]["tokens"] / (16 * 256))  # the tokens assumed
    assert set(mixture["weights"]) == set(TRAINED)  # the held-out target is never trained on


def test_the_walk_from_plan_to_a_training_command_without_a_hand_set_value(dataset, tmp_path, capsys):
    """Fast: plan and recommend through the command line; the sweep's table is simulated from the
    plan's own runs (the slow test below trains them)."""
    from data_mixture.collect import write_columns
    from data_mixture.plan import default_prior, heldout_truth

    plan, printed = _plan_cli(dataset, tmp_path / "plan.json", TINY, capsys)
    assert plan["validation_only"] == ["qa"] and plan["mix_domains"] == list(TRAINED)
    assert plan["warnings"] == [] and len(plan["chosen"]["sizes"]) == 3
    assert "validation-only (no run trains on it, every run is evaluated on it): qa" in printed
    truth = heldout_truth(default_prior(TRAINED), len(TRAINED))
    cols: dict[str, list] = {k: [] for k in ("run", "params_total", "params_active", "tokens", "seed")}
    cols.update({f"mix:{d}": [] for d in TRAINED} | {"loss:qa": []})
    for run in plan["runs"]:
        for frac in (0.5, 1.0):
            mix = np.array([[run["mixture"][d] for d in TRAINED]])
            for k in ("params_total", "params_active", "seed"):
                cols[k].append(run[k])
            cols["run"].append(run["name"])
            cols["tokens"].append(frac * run["tokens"])
            for d in TRAINED:
                cols[f"mix:{d}"].append(run["mixture"][d])
            cols["loss:qa"].append(float(truth(0, np.array([run["params_active"]]), np.array([frac * run["tokens"]]), mix)[0]))
    write_columns(cols, tmp_path / "runs.csv")
    command, mixture = _recommend_cli(str(tmp_path / "runs.csv"), plan, tmp_path / "rec", capsys)
    _check_command(command, plan, mixture)


@pytest.mark.slow  # trains and evaluates the plan's runs, then the recommended mixture (minutes on 2 cores)
def test_the_walk_trains_the_plan_and_the_recommended_mixture(dataset, tmp_path, capsys):
    import os
    import subprocess
    import sys

    from data_mixture.__main__ import main as dm_main
    from data_mixture.table import read_runs

    plan, _ = _plan_cli(dataset, tmp_path / "plan.json", TINY, capsys)
    root = tmp_path / "sweep"
    with pytest.raises(SystemExit) as done:
        dm_main(["sweep", "--plan", str(tmp_path / "plan.json"), "--root", str(root), "--parallel", "2",
                 "--eval-args", "--loss-batches 2", "--no-progress", "-q"])
    assert done.value.code == 0
    table = read_runs(str(root / "runs.csv"))
    assert table.mix_domains == TRAINED and "qa" in table.loss_domains  # no mix:qa column
    assert set(table.run) == {r["name"] for r in plan["runs"]}
    assert all(f"loss_se:{d}" in table.extra for d in table.loss_domains)  # the evaluation's own error, beside
    command, mixture = _recommend_cli(str(root / "runs.csv"), plan, tmp_path / "rec", capsys)
    _check_command(command, plan, mixture)
    short = [a for a in command if not a.startswith("--config.train.steps=")] + ["--config.train.steps=2"]
    short[short.index("--workdir") + 1] = str(tmp_path / "trained")
    proc = subprocess.run(short, cwd=tmp_path, capture_output=True, text=True, timeout=900,
                          env={**os.environ, "MOEJAX_PYTHON": sys.executable})
    assert proc.returncode == 0, proc.stderr[-2000:]
    assert "done: step 2" in proc.stdout
