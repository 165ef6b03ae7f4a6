"""
The machinery that the teaching files (model.py, train.py, sample.py, prepare_data.py, corridor.py,
bench.py) import, kept out of their way. README.md's "Where to read what" says what each module
holds.
"""
