# The paper's controlled experiments at demo scale: the shared settings. Each file in config/corridor/
# adds one op or control on top (curve/: the corridor curve's fixed γ; scale/: the model scales, layered
# before the op's file). One run, one thread (two at a time on a 2-core machine):
#   OMP_NUM_THREADS=1 python train.py config/corridor.py config/corridor/mix.py --seed=0 \
#       --out_dir=out/corridor/mix_s0
#   OMP_NUM_THREADS=1 python train.py config/corridor.py config/corridor/scale/2x64.py \
#       config/corridor/mix.py --seed=0 --out_dir=out/corridor/2x64_mix_s0
# docs/results.md has the loops that ran every run of its tables, and the report:
#   python corridor.py out/corridor/* --csv=docs/corridor_runs.csv
#   python corridor.py docs/corridor_runs.csv   # every statistic again, from the table alone
dataset = "pydocs"
device = "cpu"

n_layer = 4
n_head = 4
n_embd = 128
block_size = 64
batch_size = 16
dropout = 0.0

learning_rate = 2e-3
max_iters = 1200
lr_decay_iters = 1200
min_lr = 2e-4
warmup_iters = 50
beta2 = 0.99
weight_decay = 0.1

eval_interval = 300  # evaluations do not change training (their batches are separate): 5 per run
# the val loss: the whole val split (~46k tokens, under val_tokens' cap), in order, at every evaluation,
# the same for every seed; eval_iters: the 40 sampled batches of 16 x 64 tokens of the train-split estimate
eval_iters = 10
log_interval = 50
