# GPT-2 124M on FineWeb (pre-tokenised GPT-2 shards, as modded-nanogpt and llm.c use): attention vs δ(γI + P).
# Their yardstick, not our measurement: the GPT-2-small speedrun target is a FineWeb val loss of 3.28, which llm.c's
# GPT-2 124M reaches in ~10B tokens. This config trains ~9.8B tokens (one pass over the 103 train shards).
# First: python prepare_data.py fineweb10B   (needs the network; 104 files of ~200 MB; --train_shards=N fetches N only)
#   torchrun --standalone --nproc_per_node=8 train.py config/train_gpt2_fineweb.py                # learned δ(γI + P)
#   torchrun --standalone --nproc_per_node=8 train.py config/train_gpt2_fineweb.py --op=attention \
#       --out_dir=out/gpt2_fineweb_attention
#   python train.py config/train_gpt2_fineweb.py               # one GPU: the same run, 8 times the accumulation steps
out_dir = "out/gpt2_fineweb_mix"
dataset = "fineweb10B"
op = "mix"

# 12 batch * 1024 tokens * 40 accumulation steps = ~0.5M tokens per iteration, shared by the GPUs
batch_size = 12
block_size = 1024
gradient_accumulation_steps = 5 * 8

n_layer = 12
n_head = 12
n_embd = 768
dropout = 0.0

# 20k iterations * 0.5M tokens = ~9.8B tokens
learning_rate = 6e-4
max_iters = 20000
lr_decay_iters = 20000
min_lr = 6e-5
warmup_iters = 700
weight_decay = 1e-1

eval_interval = 500
eval_iters = 200
log_interval = 10
