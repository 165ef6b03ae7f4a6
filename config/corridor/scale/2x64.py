# the small scale: 2 layers of 64 (2 heads of 32); layered between config/corridor.py and the op's file
n_layer = 2
n_head = 2
n_embd = 64
