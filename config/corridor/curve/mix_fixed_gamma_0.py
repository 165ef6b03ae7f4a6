op = "mix"  # the corridor curve: val loss with γ fixed at 0.0 and δ fixed at 1 (γ = -0.5 is ../mix_fixed_gamma.py)
gamma_init = 0.0
learn_gamma = False
learn_delta = False
