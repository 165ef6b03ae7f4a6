# the large scale: 6 layers of 256 (8 heads of 32); layered between config/corridor.py and the op's file
n_layer = 6
n_head = 8
n_embd = 256
