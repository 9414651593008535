"""The command line: ``python -m moejax.interop.hf import|export`` (``moejax hf``)."""

from __future__ import annotations

import argparse
import os

from moejax import paths
from moejax.commands import train_command
from moejax.interop.hf import tokenizer_files, workdir  # called as workdir.<name>, so a patched function is the one run
from moejax.interop.hf.configs import SUPPORTED
from moejax.interop.hf.safetensors_io import DEFAULT_MAX_SHARD_SIZE
from moejax.log import add_verbosity_flags
from moejax.model.transformer import DTYPES
from moejax.runner import run


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="python -m moejax.interop.hf",
        description="Import Hugging Face MoE checkpoints into moejax workdirs, or export them back.",
    )
    sub = parser.add_subparsers(dest="command", required=True)
    imp = sub.add_parser("import", help="HF directory (config.json + safetensors) -> moejax workdir")
    imp.add_argument("--hf-dir", required=True, type=paths.path_type, help="directory written by save_pretrained")
    imp.add_argument("--workdir", required=True, type=paths.path_type, help="new moejax workdir to write")
    imp.add_argument("--force", action="store_true", help="replace an existing non-empty --workdir (as a whole)")
    imp.add_argument("--with-optimizer", action="store_true",
                     help="write a whole train state (fresh AdamW moments, float32 by default) instead of the "
                          "parameters only, so a run in --workdir itself resumes it")
    exp = sub.add_parser("export", help="moejax workdir checkpoint -> HF directory")
    exp.add_argument("--workdir", required=True, type=paths.path_type, help="moejax workdir with checkpoints/")
    exp.add_argument("--step", type=int, default=None, help="checkpoint step (default: the latest)")
    exp.add_argument("--hf-dir", required=True, type=paths.path_type, help="output directory (config.json, model.safetensors)")
    exp.add_argument("--arch", choices=SUPPORTED, default=None, help="target model_type (default: chosen)")
    exp.add_argument("--dtype", choices=tuple(DTYPES), default=None,
                     help="cast the tensors to this dtype (default: keep the checkpoint's)")
    exp.add_argument("--max-shard-size", default=DEFAULT_MAX_SHARD_SIZE,
                     help="largest safetensors file, e.g. 5GB, 500MB, 2GiB (default: %(default)s); more "
                          "than one file: model-0000i-of-0000n.safetensors + model.safetensors.index.json")
    exp.add_argument("--force", action="store_true",
                     help="replace a previous export in --hf-dir (as a whole); a directory holding anything an export did not write (an imported checkpoint, other files) is refused, as is one that is, holds or lies inside --workdir")
    for command in (imp, exp):
        add_verbosity_flags(command)
    return parser


def main(argv: list[str] | None = None) -> int:
    args = _parser().parse_args(argv)
    target = args.workdir if args.command == "import" else args.hf_dir
    return run(lambda: _convert(args), prog="moejax", verbosity=args.verbosity, quiet_absl=True,
               interrupted=f"interrupted; nothing was written to {target} (it is renamed into place only when "
                           "complete). Rerun the command.")


def _kind(m) -> str:
    if m.first_k_dense >= m.num_layers:
        return "all dense; make an MoE of it with: moejax upcycle --from WORKDIR --workdir OUT --experts E --top-k K"
    return f"{m.moe.num_experts} experts"


def _convert(args: argparse.Namespace) -> None:
    """``import`` or ``export``, and the lines saying what was written."""
    if args.command == "import":
        cfg = workdir.import_to_workdir(args.hf_dir, args.workdir, force=args.force,
                                       with_optimizer=args.with_optimizer)
        experiment = paths.user_path(os.path.join(args.workdir, workdir.EXPERIMENT_FILE))
        print(f"imported {args.hf_dir} into {args.workdir} (step 0); train from it with: "
              f"{train_command(experiment, 'runs/NAME', [])}"
              f" ({cfg.model.num_layers} layers, {_kind(cfg.model)})")
        if os.path.isdir(os.path.join(args.workdir, tokenizer_files.TOKENIZER_DIR)):
            print(f"its tokenizer is in {os.path.join(args.workdir, tokenizer_files.TOKENIZER_DIR)}; prepare data for "
                  f"it with: {tokenizer_files.prepare_command(args.workdir)}, and train with "
                  "--config.data.path=datasets/NAME")
        else:
            print(f"{args.hf_dir} has no tokenizer.json: no tokenizer was imported")
    else:
        arch = workdir.export_from_workdir(args.workdir, args.hf_dir, step=args.step, arch=args.arch,
                                           dtype=args.dtype, force=args.force,
                                           max_shard_size=args.max_shard_size)
        print(f"exported {args.workdir} as {arch} to {args.hf_dir}")
