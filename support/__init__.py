"""
The machinery that the teaching files (model.py, train.py, sample.py, prepare_data.py, corridor.py, bench.py)
import, kept out of their way:

    configurator.py  settings: defaults, config files, --key=value, each checked once; files opened safely
    dataloader.py    the token shards: format, tokenizers, the training loader, the fixed val set
    settings.py      train.py's settings: their rules, and what a checkpoint or pretrained model fixes
    rundir.py        a run directory: its lock, log, config and checkpoints, and their checks
    hardware.py      device, dtype, DDP processes, peak FLOP/s
    hellaswag.py     HellaSwag's examples, rendered and scored
    kernel_check.py  the fused kernel's float64 check and timing (impl='auto'), and its pass/fail gate
    figures.py       the PNG figures corridor.py writes
"""
