op = "mix"  # γ learned 10× faster, δ fixed to 1: does a fast γ without δ reach the corridor's best?
op_lr_scale = 10.0
learn_delta = False
