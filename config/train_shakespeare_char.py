# nanoGPT's shakespeare_char baseline on one GPU (about 3 minutes on an A100 for attention), with
# learned δ(γI + P) heads. First: python prepare_data.py shakespeare_char   (needs the network)
#   python train.py config/train_shakespeare_char.py                 # or --op=attention to compare
out_dir = "out/shakespeare_char"
eval_interval = 250
eval_iters = 200
log_interval = 10
always_save_checkpoint = False  # the data is tiny: keep the checkpoint with the best val loss

dataset = "shakespeare_char"
gradient_accumulation_steps = 1
batch_size = 64
block_size = 256

n_layer = 6
n_head = 6
n_embd = 384
dropout = 0.2
op = "mix"

learning_rate = 1e-3
max_iters = 5000
lr_decay_iters = 5000
min_lr = 1e-4
beta2 = 0.99
warmup_iters = 100
