# Fine-tune OpenAI's GPT-2 (124M) on OpenWebText with every head switched to δ(γI + P). At γ=0, δ=1 the
# model is exactly GPT-2, so the run starts at attention and the log shows where the heads move.
# First: python prepare_data.py openwebtext   (or any dataset prepared with --tokenizer=gpt2)
#   python train.py config/finetune_gpt2.py                        # one GPU
#   python train.py config/finetune_gpt2.py --init_from=path/to/hf_gpt2_dir   # weights saved locally
out_dir = "out/finetune_gpt2_mix"
init_from = "gpt2"  # or gpt2-medium, gpt2-large, gpt2-xl
dataset = "openwebtext"
op = "mix"

batch_size = 8
block_size = 1024
gradient_accumulation_steps = 16

learning_rate = 3e-5
op_lr_scale = 100.0  # γ and δ learn at 3e-3: at 3e-5 Adam could move them only ~0.06 in 2000 steps
decay_lr = False
max_iters = 2000
eval_interval = 100
eval_iters = 40
log_interval = 10
always_save_checkpoint = False
