"""
OpenAI's GPT-2 weights for GPT.from_pretrained: a hub name (gpt2 .. gpt2-xl, downloaded once
into the hub's cache) or a local folder saved with transformers' save_pretrained, read as
config.json and model.safetensors (or its shards) and checked before any model is built: a GPT-2
config (model_type "gpt2", GPT-2's GELU and MLP), then exactly the tensors
GPT-2 of that config has, by name and shape, finite (a saved lm_head only as
a copy of the embedding: GPT-2 ties them, and so does this GPT). safetensors hold only tensors,
so no pickled code ever runs (pytorch_model.bin is refused). Every refusal is one ValueError
that names the file and says what to do.
"""
import contextlib
import json
import os
import re

import torch
from safetensors import safe_open

from support.configurator import ConfigError, read_regular, refuse_unless_regular

# the hub's GPT-2s: n_layer, n_head, n_embd (1024 positions each)
PRETRAINED = {"gpt2": (12, 12, 768), "gpt2-medium": (24, 16, 1024), "gpt2-large": (36, 20, 1280),
              "gpt2-xl": (48, 25, 1600)}
IGNORED = re.compile(r"h\.\d+\.attn\.(bias|masked_bias)")  # the causal masks older versions saved
SAVE_AGAIN = "save it again with transformers' save_pretrained (safetensors)"


def gpt2_weights(name_or_path):
    """(sizes, weights): GPTConfig's block_size, vocab_size, n_layer, n_head, n_embd, and a
    checked state dict in this project's names and GPT-2's layouts (GPT.from_pretrained
    transposes its Conv1D weights)."""
    if os.path.isdir(name_or_path):
        config = read_config(os.path.join(name_or_path, "config.json"), name_or_path)
        files = weight_files(name_or_path)
    elif name_or_path in PRETRAINED:
        config_path, weights_path = download(name_or_path)
        config, files = read_config(config_path, name_or_path), [weights_path]
    else:
        raise ConfigError(f"unknown pretrained model {name_or_path!r}: use one of "
                          f"{', '.join(PRETRAINED)} or a local directory saved with transformers' "
                          "save_pretrained")
    C, L = config["n_embd"], config["n_layer"]
    shapes = {"wte.weight": (config["vocab_size"], C), "wpe.weight": (config["n_positions"], C),
              "ln_f.weight": (C,), "ln_f.bias": (C,)}
    block = {"ln_1.weight": (C,), "ln_1.bias": (C,), "attn.c_attn.weight": (C, 3 * C),
             "attn.c_attn.bias": (3 * C,), "attn.c_proj.weight": (C, C), "attn.c_proj.bias": (C,),
             "ln_2.weight": (C,), "ln_2.bias": (C,), "mlp.c_fc.weight": (C, 4 * C),
             "mlp.c_fc.bias": (4 * C,), "mlp.c_proj.weight": (4 * C, C), "mlp.c_proj.bias": (C,)}
    with contextlib.ExitStack() as stack:
        # GPT-2's name (without "transformer.") -> (the open file, the name in it, its path)
        found = {}
        for path in files:
            try:
                f = stack.enter_context(safe_open(path, framework="pt"))
            # safetensors' SafetensorError: empty, truncated, not safetensors
            except Exception as e:
                raise ConfigError(f"{path} cannot be read as safetensors ({type(e).__name__}): "
                                  f"it is corrupt or incomplete; {SAVE_AGAIN}") from None
            for key in f.keys():
                name = key.removeprefix("transformer.")
                if not IGNORED.fullmatch(name):
                    found[name] = (f, key, path)
        # GPT-2 ties it to wte: a saved copy is only compared
        head = found.pop("lm_head.weight", None)
        layers = {n.split(".")[1] for n in found if re.match(r"h\.\d+\.", n)}
        # before the expected names are listed: config.json may claim a million layers. Its other
        # sizes are the tensors' shapes, checked below without reading them
        if len(layers) != L:
            raise ConfigError(f"{name_or_path}: config.json says n_layer={L} but the weights hold "
                              f"{len(layers)} layers; {SAVE_AGAIN}")
        shapes.update({f"h.{i}.{k}": s for i in range(L) for k, s in block.items()})
        weights = {}
        for name in sorted(set(shapes) | set(found)):
            if name not in found:
                raise ConfigError(f"{name_or_path}: the weights lack {name}; not a whole GPT-2: "
                                  f"{SAVE_AGAIN}")
            f, key, path = found[name]
            if name not in shapes:
                raise ConfigError(f"{path}: unexpected tensor {key}, not GPT-2's; {SAVE_AGAIN}")
            shape = tuple(f.get_slice(key).get_shape())  # read before the tensor is
            if shape != shapes[name]:
                raise ConfigError(f"{path}: {key} has shape {shape} but config.json implies "
                                  f"{shapes[name]}; {SAVE_AGAIN}")
            w = weights["transformer." + name] = f.get_tensor(key)
            if not torch.isfinite(w).all():  # a diverged run's
                raise ConfigError(f"{path}: {key} holds NaN or infinite numbers; {SAVE_AGAIN}")
        if head and not torch.equal(head[0].get_tensor(head[1]), weights["transformer.wte.weight"]):
            raise ConfigError(f"{head[2]}: {head[1]} differs from the embedding "
                              "transformer.wte.weight; this GPT ties its head to the embedding, as "
                              "GPT-2 does: an untied head cannot be loaded")
    return {**config_sizes(config), "vocab_size": config["vocab_size"]}, weights


def gpt2_sizes(name_or_path):
    """A GPT-2's block_size, n_layer, n_head, n_embd, known before its weights are read."""
    if not os.path.isdir(name_or_path) and name_or_path in PRETRAINED:  # a hub name: no download
        return dict(zip(("n_layer", "n_head", "n_embd"), PRETRAINED[name_or_path]), block_size=1024)
    return config_sizes(read_config(os.path.join(name_or_path, "config.json"), name_or_path))


def config_sizes(config):
    """GPTConfig's sizes in a GPT-2's config.json."""
    return dict(block_size=config["n_positions"], n_layer=config["n_layer"],
                n_head=config["n_head"], n_embd=config["n_embd"])


def download(name):
    """The paths of the hub's config.json and model.safetensors in its cache (links resolved)."""
    import huggingface_hub  # lazy: only for the hub names
    try:
        return [os.path.realpath(huggingface_hub.hf_hub_download(repo_id=name, filename=f))
                for f in ("config.json", "model.safetensors")]
    # offline, no such file, a broken connection: the hub's own error classes
    except Exception as e:
        why = type(e).__name__
        raise ConfigError(f"could not load {name!r} from the Hugging Face hub ({why}); offline, pass a "
                          "local directory saved with save_pretrained instead") from None


def read_config(path, source):
    if not os.path.lexists(path):
        raise ConfigError(f"{source!r} is not a directory saved with transformers' save_pretrained "
                          "(no config.json): pass a GPT-2 folder or a hub name such as gpt2")
    text = read_regular(path, 1 << 20)  # a config.json is a few kB
    try:
        config = json.loads(text)
    except ValueError as e:  # not JSON, not UTF-8
        raise ConfigError(f"{path} is not JSON ({type(e).__name__}); {SAVE_AGAIN}") from None
    kind = config.get("model_type")
    if kind != "gpt2":
        raise ConfigError(f"{path} describes model_type {kind!r}, not 'gpt2': init_from takes "
                          "GPT-2 only")
    mlp = config.get("n_inner") in (None, 4 * config["n_embd"])
    gelu = config.get("activation_function", "gelu_new")  # transformers' GPT-2 default: gelu_new
    if not mlp or gelu not in ("gelu_new", "gelu_pytorch_tanh"):
        raise ConfigError(f"{path}: this GPT has GPT-2's MLP only (n_inner = 4·n_embd, the tanh "
                          "GELU)")
    return config


def weight_files(folder):
    """model.safetensors, or the shards its index names; a folder with only pickled weights is
    refused."""
    single = os.path.join(folder, "model.safetensors")
    index = os.path.join(folder, "model.safetensors.index.json")
    if os.path.lexists(single):
        files = [single]
    elif os.path.lexists(index):
        text = read_regular(index, 1 << 24)
        try:
            names = sorted(set(json.loads(text)["weight_map"].values()))
        except ValueError:  # cut short, emptied
            raise ConfigError(f"{index} is not a safetensors index (JSON with a weight_map); "
                              f"{SAVE_AGAIN}") from None
        files = [os.path.join(folder, n) for n in names]
    elif any(os.path.lexists(os.path.join(folder, n)) for n in ("pytorch_model.bin", "tf_model.h5")):
        raise ConfigError(f"{folder} holds only pickled (or TensorFlow) weights, which can run "
                          f"code when read; {SAVE_AGAIN}")
    else:
        raise ConfigError(f"{folder!r} is not a directory saved with transformers' save_pretrained "
                          "(no model.safetensors)")
    for path in files:
        refuse_unless_regular(path)  # a link, a FIFO or a device: never read
        if not os.path.exists(path):
            raise ConfigError(f"{path} is missing; {SAVE_AGAIN}")
    return files
