# GPT-2 124M on OpenWebText, the paper-scale run: ~300B tokens on 8 GPUs (nanoGPT reaches ~2.85 val loss
# with attention). First: python prepare_data.py openwebtext   (needs the network; ~9B tokens of shards)
#   torchrun --standalone --nproc_per_node=8 train.py config/train_gpt2_owt.py   # learned δ(γI + P)
#   torchrun --standalone --nproc_per_node=8 train.py config/train_gpt2_owt.py --op=attention \
#       --out_dir=out/gpt2_owt_attention
# The model (12 layers, 12 heads, 768 wide, block 1024), batch_size 12 and AdamW at 6e-4: train.py's defaults.
out_dir = "out/gpt2_owt_mix"
dataset = "openwebtext"
op = "mix"
gradient_accumulation_steps = 5 * 8  # 12 batch * 1024 tokens * 40 = ~0.5M tokens per iteration, all GPUs
max_iters = 600000  # * 0.5M tokens = ~300B tokens
lr_decay_iters = 600000
warmup_iters = 2000
eval_interval = 1000
eval_iters = 200
