op = "attention"  # softmax attention P: the baseline
