op = "laplacian"  # I - P on half the heads of every layer (Zhang & Papyan), attention on the rest
