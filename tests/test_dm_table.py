"""Runs table: CSV round trip and every bad input gets an error naming rows, runs and columns."""

import numpy as np
import pytest

from data_mixture.laws import get_law
from data_mixture.table import TableError, from_columns, read_runs, write_runs


def good_columns():
    return {
        "run": ["a", "a", "b", "c"],
        "params_total": [1e6, 1e6, 2e6, 4e6],
        "params_active": [1e6, 1e6, 1e6, 2e6],
        "tokens": [1e8, 2e8, 1e8, 1e8],
        "mix:code": [0.5, 0.5, 0.2, 0.3335],
        "mix:prose": [0.5, 0.5, 0.8, 0.6665],
        "loss:valid": [3.1, 2.9, 2.8, 2.7],
        "bench:qa": ["0.3", "", "0.4", "0.5"],
        "note": ["x", "y", "z", "w"],
    }


def with_(**changes):
    cols = good_columns()
    for k, v in changes.items():
        if v is None:
            del cols[k]
        else:
            cols[k] = v
    return cols


def test_valid_table_and_csv_round_trip(tmp_path):
    t = from_columns(good_columns())
    assert t.mix_domains == ("code", "prose") and t.loss_domains == ("valid",) and t.bench_tasks == ("qa",)
    np.testing.assert_allclose(t.mix_rm.sum(1), 1.0, rtol=0, atol=1e-15)
    assert np.isnan(t.bench_rt[1, 0]) and t.extra["note"][2] == "z"
    names, inv = t.run_groups()
    assert list(names) == ["a", "b", "c"] and list(inv) == [0, 0, 1, 2]
    write_runs(t, tmp_path / "runs.csv", extra={"pred:valid": np.arange(4.0)})
    u = read_runs(tmp_path / "runs.csv")
    for f in ("params_total", "params_active", "tokens", "mix_rm", "loss_rv"):
        np.testing.assert_array_equal(getattr(t, f), getattr(u, f))
    assert u.extra["pred:valid"][3] == "3.0"
    sub = t.take([0, 2])
    assert list(sub.run) == ["a", "b"] and sub.loss_rv.shape == (2, 1)


def test_size_column_choice():
    t = from_columns(good_columns())
    np.testing.assert_array_equal(t.size("params_active"), [1e6, 1e6, 1e6, 2e6])
    with pytest.raises(TableError, match=r"size column 'flops'.*params_total, params_active"):
        t.size("flops")


@pytest.mark.parametrize(
    "changes, pattern",
    [
        # weights off the simplex / negative (rows and runs named)
        ({"mix:code": [0.5, 0.5, 0.5, 0.3335]}, r"do not sum to 1 in row 3 \(run 'b', value 1\.3\).*mix:code, mix:prose"),
        ({"mix:code": [0.5, 0.5, -0.2, 0.3335], "mix:prose": [0.5, 0.5, 1.2, 0.6665]}, r"column 'mix:code': negative weight in row 3 \(run 'b', value -0\.2\)"),
        # a domain column empty in some rows / missing
        ({"mix:prose": [0.5, 0.5, "", 0.6665]}, r"column 'mix:prose': empty cell in row 3 \(run 'b'\)"),
        ({"loss:valid": [3.1, " ", 2.8, ""]}, r"column 'loss:valid': empty cell in rows 2 \(run 'a'\), 4 \(run 'c'\)"),
        ({"loss:valid": None}, r"no 'loss:<domain>' columns"),
        ({"mix:code": None, "mix:prose": None}, r"no 'mix:<domain>' columns"),
        ({"tokens": None}, r"missing required column\(s\) 'tokens'"),
        # non-finite / non-positive losses, sizes, tokens; non-numeric cells
        ({"loss:valid": [3.1, "nan", 2.8, 2.7]}, r"column 'loss:valid': row 2 \(run 'a', value nan\); allowed: a finite number > 0"),
        ({"loss:valid": [3.1, 2.9, "inf", 2.7]}, r"column 'loss:valid': row 3 \(run 'b', value inf\)"),
        ({"loss:valid": [3.1, 2.9, 2.8, 0.0]}, r"column 'loss:valid': row 4 \(run 'c', value 0\.0\); allowed: a finite number > 0"),
        ({"loss:valid": [3.1, "abc", 2.8, 2.7]}, r"column 'loss:valid': non-numeric value in row 2 \(run 'a', value 'abc'\)"),
        ({"params_total": [1e6, 1e6, -2e6, 4e6]}, r"column 'params_total': row 3 \(run 'b'"),
        ({"tokens": [1e8, 0, 1e8, 1e8]}, r"column 'tokens': row 2 \(run 'a', value 0\.0\)"),
        ({"params_active": [1e6, 1e6, 3e6, 2e6]}, r"params_active > params_total in row 3 \(run 'b'"),
        ({"bench:qa": ["0.3", "", "x", "0.5"]}, r"column 'bench:qa': non-numeric value in row 3 \(run 'b', value 'x'\)"),
        # duplicate (run, tokens)
        ({"tokens": [1e8, 1e8, 1e8, 1e8]}, r"duplicate \(run, tokens\) rows: rows 1 and 2 \(run 'a', tokens 1e\+08\)"),
        # one run = one model and one mixture
        ({"params_total": [1e6, 2e6, 2e6, 4e6]}, r"run 'a' has params_total 1e\+06 in row 1 but 2e\+06 in row 2"),
        ({"mix:code": [0.5, 0.4, 0.2, 0.3335], "mix:prose": [0.5, 0.6, 0.8, 0.6665]}, r"run 'a' has mixture \[0\.5, 0\.5\] in row 1 but \[0\.4, 0\.6\] in row 2"),
        ({"run": ["a", "", "b", "c"]}, r"column 'run': empty run name in rows 2"),
        ({"mix:": [0.1, 0.1, 0.1, 0.1]}, r"column 'mix:' has no domain name"),
    ],
)
def test_bad_input_names_rows_and_columns(changes, pattern):
    with pytest.raises(TableError, match=pattern):
        from_columns(with_(**changes))


def test_weights_within_tolerance_are_renormalised():
    t = from_columns(with_(**{"mix:code": [0.5, 0.5, 0.2004, 0.3335]}))
    assert t.mix_rm[2].sum() == pytest.approx(1.0, abs=1e-15)
    assert t.mix_rm[2, 0] == pytest.approx(0.2004 / 1.0004)


def test_query_table_needs_no_losses():
    t = from_columns(with_(**{"loss:valid": None}), query=True)
    assert t.loss_rv is None and t.loss_domains == ()
    q = from_columns(with_(**{"loss:valid": [3.0, "", 2.0, 1.0]}), query=True)
    assert np.isnan(q.loss_rv[1, 0])


def test_csv_errors_name_file_and_rows(tmp_path):
    p = tmp_path / "bad.csv"
    p.write_text("run,params_total,params_active,tokens,mix:a,mix:b,loss:v\nr1,1e6,1e6,1e8,0.5,0.5,3.0\nr2,1e6,1e6,1e8,0.5\n")
    with pytest.raises(TableError, match=r"bad\.csv: data rows 2 \(5 cells\) do not have the header's 7 cells"):
        read_runs(p)
    p.write_text("run,tokens,tokens\n")
    with pytest.raises(TableError, match=r"column\(s\) 'tokens' appear more than once"):
        read_runs(p)
    p.write_text("run,params_total,params_active,tokens,mix:a,mix:b,loss:v\nr1,1e6,1e6,1e8,0.5,0.5,-3.0\n")
    with pytest.raises(TableError, match=r"bad\.csv: column 'loss:v': row 1 \(run 'r1', value -3\.0\)"):
        read_runs(p)
    with pytest.raises(TableError, match="does not exist"):
        read_runs(tmp_path / "missing.csv")


def _ladder(n_sizes, n_runs, m=2, tokens_distinct=True, same_mix=True):
    rng = np.random.default_rng(0)
    mixes = rng.dirichlet(np.ones(m), n_runs)
    cols = {"run": [], "params_total": [], "params_active": [], "tokens": [], "loss:v": []}
    cols.update({f"mix:d{j}": [] for j in range(m)})
    for s in range(n_sizes):
        for k in range(n_runs):
            mix = mixes[k] if same_mix else rng.dirichlet(np.ones(m))
            for c, frac in enumerate((1.0, 2.0) if tokens_distinct else (1.0,)):
                cols["run"].append(f"s{s}k{k}")
                cols["params_total"].append(1e6 * 4**s)
                cols["params_active"].append(1e6 * 4**s)
                cols["tokens"].append(1e8 * frac)
                cols["loss:v"].append(3.0 - 0.1 * s - 0.05 * c)
                for j in range(m):
                    cols[f"mix:d{j}"].append(mix[j])
    return from_columns(cols)


@pytest.mark.parametrize("law", ["mixing_law", "additive", "camel", "regmix", "regmix_linear"])
def test_too_few_runs_for_a_law(law):
    with pytest.raises(TableError, match=rf"law '{law}' cannot be identified from this table: it has 2 runs \(needs at least \d+ for 2 training domains\)"):
        get_law(law).fit(_ladder(1, 2), "v")


@pytest.mark.parametrize("law", ["mixing_law", "additive", "camel"])
def test_too_few_sizes_for_a_law(law):
    with pytest.raises(TableError, match=r"1 distinct model size\(s\) in column 'params_total' \(needs at least 2\)"):
        get_law(law).fit(_ladder(1, 40), "v")


def test_single_token_count_fixes_the_token_exponent():
    """A table with one token count cannot identify a token exponent: the law fixes it (no refusal)."""
    law = get_law("camel")
    fixed, reason = law.resolve_fixed(_ladder(3, 12, tokens_distinct=False), "params_total")
    assert fixed[law.token_exponent] == law.token_exponent_default
    assert "one token count" in reason or "token" in reason


def test_mixing_law_needs_each_mixture_at_several_sizes():
    with pytest.raises(TableError, match=r"every mixture needs runs at >= 2 model sizes.*: mixture \[.*\] \(rows 1 \(run 's0k0'\).*1 size\(s\), 2 token count\(s\)\)"):
        get_law("mixing_law").fit(_ladder(3, 6, same_mix=False), "v")


def test_unknown_domain_and_law():
    t = _ladder(2, 6)
    with pytest.raises(TableError, match=r"validation domain 'nope' is not in the table.*its loss domains: v"):
        get_law("additive").fit(t, "nope")
    with pytest.raises(TableError, match=r"unknown law 'camle'. Did you mean 'camel'\?"):
        get_law("camle")


def midtrain_columns():
    """Two bases (b1 at 1e6, b2 at 4e6), mid-training runs from them, two seeds of one mixture."""
    return {
        "run": ["b1", "m1", "m1s1", "m2", "b2", "m3"],
        "params_total": [1e6, 1e6, 1e6, 1e6, 4e6, 4e6],
        "params_active": [1e6, 1e6, 1e6, 1e6, 4e6, 4e6],
        "tokens": [2e7, 1e6, 1e6, 1e6, 8e7, 1e6],
        "mix:code": [0.5, 0.2, 0.2, 0.8, 0.5, 0.2],
        "mix:prose": [0.5, 0.8, 0.8, 0.2, 0.5, 0.8],
        "loss:valid": [3.0, 2.9, 2.91, 2.95, 2.6, 2.5],
        "seed": ["0", "0", "1", "0", "0", "0"],
        "base": ["", "b1", "b1", "b1", "", "b2"],
        "base_tokens": ["", "2e7", "2e7", "2e7", "", "8e7"],
    }


def test_mid_training_table_round_trip_and_law_rows(tmp_path):
    t = from_columns(midtrain_columns())
    np.testing.assert_array_equal(t.seeds(), [0, 0, 1, 0, 0, 0])
    np.testing.assert_array_equal(t.mid_training(), [False, True, True, True, False, True])
    np.testing.assert_array_equal(t.base_tokens, [0, 2e7, 2e7, 2e7, 0, 8e7])
    law = t.law_rows()  # the laws see the mid-training rows only
    assert law.run.tolist() == ["m1", "m1s1", "m2", "m3"]
    keys = law.mixture_keys()
    assert keys[0] == keys[1] and len(set(keys.tolist())) == 3  # m1 and its replicate share a cell
    write_runs(t, tmp_path / "mid.csv")
    back = read_runs(tmp_path / "mid.csv")
    np.testing.assert_array_equal(back.seed, t.seed)
    np.testing.assert_array_equal(back.base, t.base)
    np.testing.assert_array_equal(back.base_tokens, t.base_tokens)
    plain = from_columns(good_columns())  # a table without the protocol columns: one seed, from scratch
    assert plain.seed is None and plain.seeds().tolist() == [0, 0, 0, 0] and plain.law_rows() is plain


@pytest.mark.parametrize(
    "changes, pattern",
    [
        ({"seed": ["0", "x", "1", "0", "0", "0"]}, r"column 'seed': row 2 \(run 'm1', value 'x'\) is not an integer"),
        ({"seed": ["0", "1.5", "1", "0", "0", "0"]}, r"column 'seed': row 2 \(run 'm1', value '1\.5'\) is not an integer"),
        ({"base": ["", "b9", "b1", "b1", "", "b2"]}, r"column 'base': row 2 \(run 'm1', value 'b9'\) names a base that is not a run"),
        ({"base": ["", "b2", "b1", "b1", "", "b2"]}, r"column 'base': row 2 .*b2 has params_total 4e\+06, the run 1e\+06"),
        ({"base_tokens": ["", "", "2e7", "2e7", "", "8e7"]}, r"column 'base_tokens': row 2 \(run 'm1', value nan\) has a base but no base token count"),
        ({"base_tokens": ["5", "2e7", "2e7", "2e7", "", "8e7"]}, r"column 'base_tokens': row 1 \(run 'b1', value 5\.0\) has base tokens but an empty 'base'"),
        ({"base_tokens": None}, r"column 'base' without a 'base_tokens' column"),
        ({"base": None}, r"column 'base_tokens' without a 'base' column"),
        ({"run": ["b1", "m1", "m1", "m2", "b2", "m3"], "tokens": [2e7, 1e6, 2e6, 1e6, 8e7, 1e6]},
         r"run 'm1' has seed 0 in row 2 but 1 in row 3; allowed: one seed per run"),
    ],
)
def test_bad_protocol_columns_are_named(changes, pattern):
    cols = midtrain_columns()
    for k, v in changes.items():
        if v is None:
            del cols[k]
        else:
            cols[k] = v
    with pytest.raises(TableError, match=pattern):
        from_columns(cols)


def test_fit_uses_the_mid_training_rows_only():
    from data_mixture.fit import fit_table

    rng = np.random.default_rng(0)
    cols = {k: [] for k in ("run", "params_total", "params_active", "tokens", "mix:code", "mix:prose", "loss:valid", "base", "base_tokens")}
    for n in (1e6, 4e6):
        rows = [(f"b{n:g}", 0.5, 2e7 * n / 1e6, "", "")] + [(f"m{n:g}_{k}", w, 1e6, f"b{n:g}", 2e7 * n / 1e6) for k, w in enumerate(rng.uniform(0.1, 0.9, 5))]
        for run, w, tokens, base, base_tokens in rows:
            for name, v in zip(cols, (run, n, n, tokens, w, 1 - w, 3.0 - 0.1 * np.log10(n) - 0.2 * w, base, base_tokens)):
                cols[name].append(v)
    fit = fit_table(from_columns(cols), "regmix_linear", bootstrap=0, progress=False)
    assert fit.info["n_rows"] == 10 and fit.info["base_rows_left_out"] == 2
