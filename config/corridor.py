# The paper's controlled experiments at demo scale: the shared settings. Each file in config/corridor/ adds one
# op or control on top, config/corridor/curve/ holds the corridor curve's fixed γ; a run is
#   python train.py config/corridor.py config/corridor/mix.py --seed=0 --out_dir=out/corridor/mix_s0
# The three groups of docs/results.md, two runs at a time on a 2-core CPU (one line each), then the report:
#   (for s in 0 1 2 3 4 5 6 7; do for e in attention mix mix_fixed_gamma mix_gamma_nonneg; do echo config/corridor/$e.py $s; done; done; for s in 0 1 2; do for e in mix_alpha mix_ab; do echo config/corridor/$e.py $s; done; done) | xargs -P 2 -n 2 sh -c 'OMP_NUM_THREADS=1 python train.py config/corridor.py $0 --seed=$1 --out_dir=out/corridor/$(basename $0 .py)_s$1 > /dev/null'
#   for s in 0 1 2; do for e in config/corridor/curve/*.py; do echo $e $s; done; done | xargs -P 2 -n 2 sh -c 'OMP_NUM_THREADS=1 python train.py config/corridor.py $0 --seed=$1 --out_dir=out/corridor/$(basename $0 .py)_s$1 > /dev/null'
#   for s in 0 1 2; do for e in attention mix; do echo $e $s; done; done | xargs -P 2 -n 2 sh -c 'OMP_NUM_THREADS=1 python train.py config/corridor.py config/corridor/$0.py --max_iters=3600 --lr_decay_iters=3600 --seed=$1 --out_dir=out/corridor_long/$0_s$1 > /dev/null'
#   python corridor.py out/corridor/* out/corridor_long/* --out=out/corridor_figures --csv=docs/corridor_runs.csv
# More settings, run the same way (not in docs/results.md): laplacian, mix_start_m09, mix_start_p05.
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
