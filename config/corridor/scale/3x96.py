# the middle scale: 3 layers of 96 (3 heads of 32); layered between config/corridor.py and the op's file
n_layer = 3
n_head = 3
n_embd = 96
