op = "mix_ab"  # α·P + β(I - P), learned from α=1, β=0
