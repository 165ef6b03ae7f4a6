op = "mix"  # γ learned from 0, δ fixed to 1: does learning δ cost what a fixed γ gains?
learn_delta = False
