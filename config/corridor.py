# The paper's controlled experiments at demo scale: the shared settings. Each file in config/corridor/
# adds one op or control on top; a run is  python train.py config/corridor.py config/corridor/mix.py --seed=0
# All nine with 3 seeds, two runs at a time on a 2-core CPU (~45 minutes), then the table and figures:
#   for e in config/corridor/*.py; do for s in 0 1 2; do echo $e $s; done; done | xargs -P 2 -n 2 sh -c 'OMP_NUM_THREADS=1 python train.py config/corridor.py $0 --seed=$1 --out_dir=out/corridor/$(basename $0 .py)_s$1 > /dev/null' && python corridor.py out/corridor/* --out=out/corridor_figures
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

eval_interval = 100
eval_iters = 40  # 40 batches of 16 x 64 tokens: about the whole val split, so val losses are precise
log_interval = 50
