# GPT-2 124M on FineWeb (pre-tokenised GPT-2 shards, as modded-nanogpt and llm.c use): attention vs
# δ(γI + P). Their yardstick, not our measurement: the GPT-2-small speedrun target is a FineWeb val loss of
# 3.28, which llm.c's GPT-2 124M reaches in ~10B tokens. This config trains ~9.8B tokens (one pass over the
# 103 train shards). First: python prepare_data.py fineweb10B   (needs the network; 104 files of ~200 MB;
# --train_shards=N fetches N only)
#   torchrun --standalone --nproc_per_node=8 train.py config/train_gpt2_fineweb.py   # learned δ(γI + P)
#   torchrun --standalone --nproc_per_node=8 train.py config/train_gpt2_fineweb.py --op=attention \
#       --out_dir=out/gpt2_fineweb_attention
#   python train.py config/train_gpt2_fineweb.py   # one GPU: the same run, 8 times the accumulation steps
# The model (12 layers, 12 heads, 768 wide, block 1024), batch_size 12 and AdamW at 6e-4: train.py's defaults.
out_dir = "out/gpt2_fineweb_mix"
dataset = "fineweb10B"
op = "mix"
gradient_accumulation_steps = 5 * 8  # 12 batch * 1024 tokens * 40 = ~0.5M tokens per iteration, all GPUs
max_iters = 20000  # * 0.5M tokens = ~9.8B tokens
lr_decay_iters = 20000
warmup_iters = 700
eval_interval = 500
eval_iters = 200  # the train-split estimate; the val loss: the first 10,485,760 val tokens, as modded-nanogpt
