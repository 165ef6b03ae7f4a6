op = "mix"  # the paper's "γ ≥ 0" control: γ projected back to ≥ 0 after every step
gamma_min = 0.0
