# The README's main job: a character-level GPT on the offline default corpus (CPython's documentation,
# prepared on the fly), heads learning δ(γI + P). About 3 minutes on 2 CPU cores.
#   python train.py config/train_demo.py
out_dir = "out/demo"
dataset = "pydocs"
op = "mix"

n_layer = 4
n_head = 4
n_embd = 128
block_size = 128
batch_size = 16
dropout = 0.0

learning_rate = 2e-3
max_iters = 1500
lr_decay_iters = 1500
min_lr = 2e-4
warmup_iters = 100
beta2 = 0.99
weight_decay = 0.1

eval_interval = 250
eval_iters = 20
log_interval = 50
device = "cpu"
