"""One transformer, one software stack, measured at two precisions on one GPU type: the pairs
``bench_llm.py --derive-transfer-width`` checks a precision change's pair spread on (not used:
leave-one-model-out it covers 40 % of them; ``uncertainty.SIGMA_TRANSFORMER_GENERATION_PAIR``'s
comment). None of these rows is in ``data/llm_training_throughput.tsv``, so ``bench_llm.py``
scores none of them, and none is a Llama 3 (the report set's models).

Source: NVIDIA/dgxc-benchmarking (DGX Cloud benchmarking recipes, NeMo on DGX H100, the
same recipe run in BF16 and in FP8 with Transformer Engine; tokens/s for the whole job):
  - ``nemo_megatron/README_175b.md`` @ 0b71cfda5163540778e2a3d2db59858bf62f96f7: GPT-3 175B,
    TP 4, PP 8, VP 12, micro-batch 1, sequence 2048, global batch 2 × GPUs (GA 64), 128-2048 H100;
    96 layers, hidden 12288, vocabulary 51,200 (its Notes' model-FLOPs formula);
  - ``nemotron/README_15b.md`` @ 0b71cfda5163540778e2a3d2db59858bf62f96f7: Nemotron-4 15B,
    TP 4, PP 1, micro-batch 4, GA 4, sequence 4096, 16-2048 H100; 32 layers, hidden 6144,
    vocabulary 256,000 (its Notes);
  - ``nemotron/README.md`` @ 1f6d9f40e4117d7c71b726f86074ac01c29f87f5 ("H100 Performance"):
    Nemotron-4 15B on 16 H100 (TP 2, micro-batch 2, GBS 64, GA 4) and Nemotron-4 340B on 256
    H100 (TP 8, PP 8, VP 12, micro-batch 1, GBS 64, GA 16); 340B: 96 layers, hidden 18432.
Heads (GPT-3 175B 96; Nemotron-4 15B 48, 340B 96) and the 4 × hidden squared-ReLU MLP (two
matrices, as a GELU MLP) are the models' published configurations (NeMo's launcher configs,
the Nemotron-4 reports); parameter counts nominal, as the table's own NeMo rows give them.
"""

from __future__ import annotations

#: (model, params, layers, hidden, seq, vocab, heads, tp, pp, vp, micro_batch,
#:  grad_accum, GPUs, bf16 tokens/s, fp8 tokens/s), tokens/s for all GPUs together.
DGXC_H100_BF16_FP8 = (
    *(("GPT3-175B", 175e9, 96, 12288, 2048, 51200, 96, 4, 8, 12, 1, 64, n, bf, f8)
      for n, bf, f8 in ((128, 63099, 93190), (256, 124712, 183157), (512, 249068, 363206),
                        (1024, 496191, 720671), (2048, 988057, 1407485))),
    *(("Nemotron4-15B", 15e9, 32, 6144, 4096, 256000, 48, 4, 1, 1, 4, 4, n, bf, f8)
      for n, bf, f8 in ((16, 93223, 128565), (32, 185654, 256250), (64, 368568, 512000),
                        (128, 733526, 1018529), (256, 1470654, 2021351),
                        (512, 2917777, 3956891), (1024, 5795239, 8012042),
                        (2048, 11622595, 15827562))),
    ("Nemotron4-15B", 15e9, 32, 6144, 4096, 256000, 48, 2, 1, 1, 2, 4, 16, 95463, 131863),
    ("Nemotron4-340B", 340e9, 96, 18432, 4096, 256000, 96, 8, 8, 12, 1, 16, 256, 56913, 84372),
)
