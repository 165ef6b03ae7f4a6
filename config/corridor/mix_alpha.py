op = "mix_alpha"  # α0·I + α1·P, learned from α0=0, α1=1
