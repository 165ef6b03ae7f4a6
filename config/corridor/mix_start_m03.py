op = "mix"  # started inside the corridor at the best fixed γ: does learning improve on it?
gamma_init = -0.3
