"""Precision set by a framework is the precision recorded (issue 11, item 2).

accelerate ``mixed_precision="bf16"`` and transformers ``TrainingArguments(bf16=True)`` enter
``torch.autocast`` inside the wrapped ``forward``, after gpuopt's forward pre-hook: the
precision must come from the dtype the products ran in. Real libraries, tiny models built
from configs (no download), CPU, a real sqlite MLflow store.
"""

from __future__ import annotations

import mlflow
import torch
import torch.nn.functional as F  # noqa: N812 - PyTorch's conventional alias

import mlflow_gpuopt as gpuopt

VOCAB, SEQ = 64, 16


def _tiny_gpt2(attn: str = "sdpa"):
    import transformers
    cfg = transformers.GPT2Config(vocab_size=VOCAB, n_positions=SEQ, n_embd=32, n_layer=2,
                                  n_head=4, bos_token_id=0, eos_token_id=0)
    torch.manual_seed(0)
    model = transformers.GPT2LMHeadModel._from_config(cfg, attn_implementation=attn)
    assert model.config._attn_implementation == attn
    return model


def test_accelerate_bf16_on_cpu_is_bf16(tracking_uri):
    import accelerate
    acc = accelerate.Accelerator(mixed_precision="bf16", cpu=True)
    model = _tiny_gpt2()
    opt = torch.optim.AdamW(model.parameters(), lr=1e-3)
    model, opt = acc.prepare(model, opt)
    assert next(model.parameters()).dtype == torch.float32  # weights stay fp32: autocast
    with gpuopt.track(model=model, interval_s=0.2, warmup_steps=1, print_summary=False) as t:
        for _ in range(4):
            ids = torch.randint(0, VOCAB, (4, SEQ))
            loss = model(input_ids=ids, labels=ids).loss
            acc.backward(loss)
            opt.step()
            opt.zero_grad()
    p = mlflow.get_run(t.run_id).data.params
    assert p["gpuopt.precision"] == "bf16"
    # GPT-2's SDPA call with its causal mask runs SDPA's math fallback on CPU: still sdpa
    assert p["gpuopt.attention"] == "sdpa"


def test_plain_fp32_loop_of_the_same_model_is_fp32(tracking_uri):
    model = _tiny_gpt2("eager")
    opt = torch.optim.AdamW(model.parameters(), lr=1e-3)
    with gpuopt.track(model=model, optimizer=opt, interval_s=0.2, print_summary=False) as t:
        for _ in range(3):
            ids = torch.randint(0, VOCAB, (4, SEQ))
            logits = model(input_ids=ids).logits
            F.cross_entropy(logits.flatten(0, 1), ids.flatten()).backward()
            opt.step()
            opt.zero_grad()
    p = mlflow.get_run(t.run_id).data.params
    assert (p["gpuopt.precision"], p["gpuopt.attention"]) == ("fp32", "eager")


def test_transformers_trainer_bf16_is_bf16(tracking_uri, tmp_path):
    import transformers
    import accelerate  # noqa: F401 - the extra must be installed
    model = _tiny_gpt2()
    ids = torch.randint(0, VOCAB, (32, SEQ))
    data = [{"input_ids": row, "labels": row} for row in ids]
    args = transformers.TrainingArguments(
        output_dir=str(tmp_path / "out"), bf16=True, use_cpu=True, max_steps=4,
        per_device_train_batch_size=4, report_to=[], save_strategy="no", logging_steps=100,
        dataloader_num_workers=0, disable_tqdm=True)
    trainer = transformers.Trainer(model=model, args=args, train_dataset=data)
    with gpuopt.track(model=model, interval_s=0.2, warmup_steps=1, print_summary=False) as t:
        trainer.train()
    p = mlflow.get_run(t.run_id).data.params
    assert p["gpuopt.precision"] == "bf16"
    assert p["gpuopt.micro_batch"] == "4"
