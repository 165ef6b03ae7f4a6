# The corridor curve: val loss with γ fixed at 0.3 and δ fixed at 1 (the other points: ../mix_fixed_gamma.py
# at γ = -0.5; at γ = 0 the operator is attention exactly, so attention's own runs are that point)
op = "mix"
gamma_init = 0.3
learn_gamma = False
learn_delta = False
