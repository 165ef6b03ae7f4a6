op = "mix"  # started outside the corridor, γ = +0.5: does γ move into it?
gamma_init = 0.5
