op = "mix"  # the corridor curve: val loss with γ fixed at -0.9 and δ fixed at 1 (γ = -0.5 is ../mix_fixed_gamma.py)
gamma_init = -0.9
learn_gamma = False
learn_delta = False
