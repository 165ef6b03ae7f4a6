op = "mix"  # started near the negative Laplacian: does γ stay in the corridor?
gamma_init = -0.9
