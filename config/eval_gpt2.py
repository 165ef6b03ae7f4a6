# Validation loss of OpenAI's GPT-2 on OpenWebText (nanoGPT measured 3.12 for the 124M model).
# First: python prepare_data.py openwebtext
#   python train.py config/eval_gpt2.py                         # --init_from=gpt2-medium etc.: the others
#   python train.py config/eval_gpt2.py --hellaswag_interval=1  # and HellaSwag (prepare_data.py hellaswag)
out_dir = "out/eval_gpt2"
init_from = "gpt2"
dataset = "openwebtext"
op = "attention"
eval_only = True
batch_size = 8
block_size = 1024
eval_iters = 20  # the train-split estimate; the val loss reads the whole val split (~4.4M tokens, val_tokens)
wandb_log = False
