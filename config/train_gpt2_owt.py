# GPT-2 124M on OpenWebText, the paper-scale run: ~300B tokens on 8 GPUs (nanoGPT reaches ~2.85 val loss
# with attention). First: python prepare_data.py openwebtext   (needs the network; ~9B tokens of shards)
#   torchrun --standalone --nproc_per_node=8 train.py config/train_gpt2_owt.py             # learned δ(γI + P)
#   torchrun --standalone --nproc_per_node=8 train.py config/train_gpt2_owt.py --op=attention --out_dir=out/gpt2_owt_attention
out_dir = "out/gpt2_owt_mix"
dataset = "openwebtext"
op = "mix"

# 12 batch * 1024 tokens * 40 accumulation steps = ~0.5M tokens per iteration, shared by the 8 GPUs
batch_size = 12
block_size = 1024
gradient_accumulation_steps = 5 * 8

n_layer = 12
n_head = 12
n_embd = 768
dropout = 0.0

# 600k iterations * 0.5M tokens = ~300B tokens
learning_rate = 6e-4
max_iters = 600000
lr_decay_iters = 600000
min_lr = 6e-5
warmup_iters = 2000
weight_decay = 1e-1

eval_interval = 1000
eval_iters = 200
log_interval = 10
