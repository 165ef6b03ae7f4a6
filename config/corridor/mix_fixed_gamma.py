op = "mix"  # γ fixed inside the corridor, δ fixed to 1: (P - 0.5·I), nothing learned
gamma_init = -0.5
learn_gamma = False
learn_delta = False
