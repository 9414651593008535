"""The training loop on a prepared dataset: its domains, tokenizer and schedule reach the loop,
and a resumed run crosses a schedule stage exactly as an uninterrupted one."""

import json
import os
import shutil

from moejax.config import default_config
from moejax.data.prepare import prepare_dataset
from moejax.data.synthetic_knowledge import knowledge_documents
from moejax.data.synthetic_math import math_documents
from moejax.train.loop import train


def test_loop_trains_on_a_prepared_dataset_and_resumes_across_a_stage(tmp_path):
    sources = {"sums": math_documents(2, 40_000), "facts": knowledge_documents(2, 40_000)}
    for domain, docs in sources.items():
        with open(tmp_path / f"{domain}.jsonl", "w") as f:
            f.writelines(json.dumps({"text": d}) + "\n" for d in docs)
    dataset = str(tmp_path / "ds")
    prepare_dataset([f"{d}={tmp_path / d}.jsonl" for d in sources], dataset, tokenizer="bpe",
                    vocab_size=300, heldout_fraction=0.1, workers=1, progress=False)
    cfg = default_config()
    t, m = cfg.train, cfg.model
    t.steps, t.global_batch_size, t.seq_len, t.log_every, t.eval_every, t.eval_batches = 4, 8, 32, 1, 4, 1
    cfg.checkpoint.every_steps, cfg.optim.warmup_steps = 2, 1
    m.vocab_size, m.d_model, m.num_layers, m.mlp_dim, m.first_k_dense = 384, 32, 2, 64, 1
    m.num_heads, m.num_kv_heads, m.head_dim = 2, 1, 16
    m.moe.num_experts, m.moe.expert_dim, m.moe.shared_expert_dim, m.moe.tile_size = 4, 16, 16, 8
    cfg.mesh.data, cfg.mesh.fsdp = 4, 2
    cfg.data.path = dataset
    cfg.data.schedule = '[[0, {"sums": 1}], [3, {"facts": 1}]]'
    workdir = str(tmp_path / "run")
    train(cfg, workdir)
    with open(os.path.join(workdir, "metrics.jsonl")) as f:
        records = [json.loads(line) for line in f if '"loss"' in line]
    tokens = [(r["tokens/sums"], r["tokens/facts"]) for r in records]
    assert tokens == [(256, 0), (512, 0), (768, 0), (768, 256)]  # 8 x 32 tokens per step
    assert set(records[-1]) >= {"eval_loss/sums", "eval_loss/facts"}

    shutil.rmtree(os.path.join(workdir, "checkpoints", "4"))  # resume from step 2
    train(cfg, workdir)
    with open(os.path.join(workdir, "metrics.jsonl")) as f:
        resumed = [json.loads(line) for line in f if '"loss"' in line]
    assert [r["step"] for r in resumed[-2:]] == [3, 4]
    assert [r["loss"] for r in resumed[-2:]] == [r["loss"] for r in records[2:]]
