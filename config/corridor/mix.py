op = "mix"  # δ(γI + P), γ and δ learned per head from γ=0, δ=1 (attention)
