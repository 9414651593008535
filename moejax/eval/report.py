"""The readable table of one evaluation result (what ``python -m moejax.eval`` prints)."""

from __future__ import annotations

from typing import Any


def _rows(header: list[str], rows: list[list[str]]) -> list[str]:
    widths = [max(len(r[i]) for r in [header, *rows]) for i in range(len(header))]
    line = lambda r: "  ".join(c.ljust(w) if i == 0 else c.rjust(w) for i, (c, w) in enumerate(zip(r, widths)))
    return [line(header), "  ".join("-" * w for w in widths), *map(line, rows)]


def _num(value: float | None) -> str:
    return "n/a" if value is None else f"{value:.3f}"


def format_result(result: dict[str, Any]) -> str:
    out = [f"step {result['step']}  ({result['workdir']}, tokenizer {result['tokenizer']})", ""]
    domains = result["losses"]["domains"]
    out += _rows(
        ["held-out", "loss", "+- se", "ppl", "bits/byte", "tokens"],
        [[d, f"{v['loss']:.4f}", "n/a" if v.get("loss_se") is None else f"{v['loss_se']:.4f}", f"{v['perplexity']:.3f}",
          f"{v['bits_per_byte']:.4f}", str(v["tokens"])]
         for d, v in domains.items()]
        + [["mean", f"{result['losses']['loss_mean']:.4f}", "", "", f"{result['losses']['bits_per_byte_mean']:.4f}", ""]],
    )
    if result["benchmarks"]:
        out.append("")
        rows = []
        for name, b in result["benchmarks"].items():
            if b["kind"] == "multiple_choice":
                items = f"{b['items']}" + (f" (+{b['skipped']} skipped)" if b["skipped"] else "")
                rows.append([name, items, *(_num(b[k]) for k in ("accuracy", "accuracy_per_token",
                                                                 "accuracy_per_byte", "ece")), "",
                             _num(b.get("gold_logprob"))])
            else:
                rows.append([name, str(b["items"]), "", "", "", "", f"{b['exact_match']:.3f}",
                             _num(b.get("gold_logprob"))])
        out += _rows(["benchmark", "items", "acc", "acc/token", "acc/byte", "ECE", "exact match", "gold logprob"], rows)
    layers = result["routing"]["layers"]
    if layers:
        out.append("")
        out += _rows(
            ["routing", "max_vio", "gini", "entropy", "load min..max"],
            [[f"layer {layer['layer']}", f"{layer['max_vio']:.3f}", f"{layer['gini']:.3f}", f"{layer['entropy']:.3f}",
              f"{min(layer['load']):.3f}..{max(layer['load']):.3f}"] for layer in layers],
        )
    out.append("")
    out += _rows(
        ["throughput", "tokens", "seconds", "tokens/s"],
        [[k, str(v["tokens"]), f"{v['seconds']:.1f}", f"{v['tokens_per_sec']:.0f}"]
         for k, v in result["throughput"].items()],
    )
    return "\n".join(out)
