op = "mix"  # learned δ(γI + P) whose γ and δ learn 10× faster: does γ reach the corridor's best sooner?
op_lr_scale = 10.0
