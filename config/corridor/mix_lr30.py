op = "mix"  # learned δ(γI + P) whose γ and δ learn 30× faster
op_lr_scale = 30.0
