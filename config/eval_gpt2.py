# Validation loss of OpenAI's GPT-2 on OpenWebText (nanoGPT measured 3.12 for the 124M model).
# First: python prepare_data.py openwebtext
#   python train.py config/eval_gpt2.py                            # --init_from=gpt2-medium etc. for the others
out_dir = "out/eval_gpt2"
init_from = "gpt2"
dataset = "openwebtext"
op = "attention"
eval_only = True
batch_size = 8
block_size = 1024
eval_iters = 500
wandb_log = False
