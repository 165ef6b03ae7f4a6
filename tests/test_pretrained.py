"""
GPT-2 weights handed to us: a hub name (`--init_from=gpt2`) or a folder (`--init_from=DIR`, sample.py's too).
support/pretrained.py checks them before any model is built. Every refusal its docstring promises has a folder
spoiled here and the one line, naming the file, that it gets; every layout transformers and the hub really
write loads the weights transformers' own model holds, each exactly. No network: the hub is FakeHub, its cache
laid out as huggingface_hub lays it out (links to blobs).

    python -m pytest -q tests/test_pretrained.py
"""
import json
import os
import shutil

import pytest
import torch
from safetensors import safe_open
from safetensors.torch import load_file, save, save_file

import sample
import train
from model import GPT
from support import settings
from support.configurator import ConfigError
from helpers import FakeHub, one_line_error, workdir  # noqa: F401 (workdir is a fixture)

transformers = pytest.importorskip("transformers")

SIZES = dict(n_positions=64, n_embd=32, n_layer=2, n_head=2, vocab_size=100)
CONV1D = ("attn.c_attn.weight", "attn.c_proj.weight", "mlp.c_fc.weight", "mlp.c_proj.weight")  # transposed


def tiny_gpt2(**config):
    torch.manual_seed(0)
    return transformers.GPT2LMHeadModel(transformers.GPT2Config(**SIZES, **config)).eval()


def assert_loads_as(hf, name_or_path):
    """GPT.from_pretrained(name_or_path) holds each of hf's weights exactly and computes hf's logits."""
    model = GPT.from_pretrained(name_or_path).eval()
    ours = model.state_dict()
    theirs = {k: w.t() if k.endswith(CONV1D) else w for k, w in hf.state_dict().items()
              if k != "lm_head.weight"}  # the tied head
    assert len(theirs) == 4 + 12 * SIZES["n_layer"]
    assert all(torch.equal(ours[k], w) for k, w in theirs.items())
    idx = torch.randint(0, SIZES["vocab_size"], (2, 16))
    with torch.no_grad():
        assert (model(idx, idx)[0] - hf(idx).logits).abs().max() <= 1e-6


def keys(path):
    with safe_open(path, framework="pt") as f:
        return set(f.keys())


@pytest.fixture(scope="module")
def saved(tmp_path_factory):
    """A tiny random GPT-2 of transformers, and the folder its save_pretrained wrote (copied, not spoiled)."""
    hf = tiny_gpt2()
    folder = tmp_path_factory.mktemp("saved") / "tiny-gpt2"
    hf.save_pretrained(folder)
    return hf, str(folder)


# --- the layouts transformers and the hub write: each loads transformers' weights ---------------------------


def test_save_pretrained_without_the_tied_head(saved):
    hf, folder = saved
    assert "lm_head.weight" not in keys(f"{folder}/model.safetensors")  # save_pretrained drops a tied copy
    assert_loads_as(hf, folder)


def test_save_pretrained_with_the_tied_head_saved(tmp_path):
    hf = tiny_gpt2(tie_word_embeddings=False)  # saved as its own tensor, the embedding's copy
    with torch.no_grad():
        hf.lm_head.weight.copy_(hf.transformer.wte.weight)
    hf.save_pretrained(tmp_path)
    assert "lm_head.weight" in keys(f"{tmp_path}/model.safetensors")
    assert_loads_as(hf, str(tmp_path))


def test_an_untied_head_is_refused_not_tied_silently(workdir):
    """This GPT ties its head to the embedding, as GPT-2 does: a head of its own would be dropped unseen."""
    tiny_gpt2(tie_word_embeddings=False).save_pretrained("untied")  # a head trained apart from wte
    assert one_line_error(sample.main, ["--init_from=untied", "--max_new_tokens=1"]).startswith(
        "error: untied/model.safetensors: lm_head.weight differs from the embedding transformer.wte.weight")


def test_save_pretrained_in_shards_with_an_index(saved, tmp_path):
    hf = saved[0]
    hf.save_pretrained(tmp_path, max_shard_size="20KB")
    shards = [n for n in os.listdir(tmp_path) if n.endswith(".safetensors")]
    assert len(shards) > 2 and "model.safetensors" not in shards
    assert_loads_as(hf, str(tmp_path))


def hub_files(folder):
    """config.json and model.safetensors as the hub holds OpenAI's GPT-2: names without 'transformer.', and
    each block's causal mask saved as h.N.attn.bias."""
    n = SIZES["n_positions"]
    tensors = {k.removeprefix("transformer."): w for k, w in load_file(f"{folder}/model.safetensors").items()}
    mask = torch.ones(n, n).tril().view(1, 1, n, n)
    tensors.update({f"h.{i}.attn.bias": mask.clone() for i in range(SIZES["n_layer"])})
    return {"config.json": open(f"{folder}/config.json", "rb").read(),
            "model.safetensors": save(tensors, metadata={"format": "pt"})}


def snapshot_of(cache):
    """The folder of gpt2's snapshot in the hub's cache, as huggingface_hub finds it."""
    import huggingface_hub
    path = huggingface_hub.try_to_load_from_cache("gpt2", "config.json", cache_dir=str(cache))
    return os.path.dirname(path)


def test_the_hubs_cache_of_links_to_blobs_is_followed(saved, tmp_path, monkeypatch):
    """Links inside the hub's own cache are followed (the hub makes them): `gpt2` loads."""
    hf, folder = saved
    hub = FakeHub(monkeypatch, hub_files(folder), cache=str(tmp_path / "hub"))
    assert_loads_as(hf, "gpt2")
    assert hub.downloads == ["config.json", "model.safetensors"]
    snapshot = snapshot_of(tmp_path / "hub")
    assert all(os.path.islink(f"{snapshot}/{name}") for name in hub.files)  # the layout this test is about


def test_a_hub_snapshot_handed_over_as_a_folder_is_refused_for_its_links(saved, tmp_path, monkeypatch):
    """A folder someone hands us is read without following links, the hub's snapshot folder too: one line."""
    FakeHub(monkeypatch, hub_files(saved[1]), cache=str(tmp_path / "hub"))
    GPT.from_pretrained("gpt2")
    snapshot = snapshot_of(tmp_path / "hub")
    assert f"{snapshot}/config.json is a symbolic link, not a regular file" in one_line_error(
        sample.main, [f"--init_from={snapshot}", "--max_new_tokens=1"])


def test_the_hub_out_of_reach_is_one_line(saved, tmp_path, monkeypatch):
    from huggingface_hub.errors import LocalEntryNotFoundError
    hub = FakeHub(monkeypatch, hub_files(saved[1]), cache=str(tmp_path / "hub"))
    hub.fail_at, hub.error = 1, LocalEntryNotFoundError("offline, and no model.safetensors in the cache")
    assert one_line_error(sample.main, ["--init_from=gpt2", "--max_new_tokens=1"]) == (
        "error: could not load 'gpt2' from the Hugging Face hub (LocalEntryNotFoundError); offline, pass a "
        "local directory saved with save_pretrained instead")


# each hub GPT-2's sizes, as its config.json on the hub gives them (n_positions = 1024 for all four)
HUB_SIZES = {"gpt2": dict(n_layer=12, n_head=12, n_embd=768),
             "gpt2-medium": dict(n_layer=24, n_head=16, n_embd=1024),
             "gpt2-large": dict(n_layer=36, n_head=20, n_embd=1280),
             "gpt2-xl": dict(n_layer=48, n_head=25, n_embd=1600)}


def fine_tune_settings(init_from):
    """The model settings train.py works out for a fine-tune from init_from, before any weight is read."""
    cfg = settings.work_out(*train.parse_config([f"--init_from={init_from}"]), train.DEFAULTS)[0]
    return {k: getattr(cfg, k) for k in ("n_layer", "n_head", "n_embd", "block_size")}


@pytest.mark.parametrize("name", HUB_SIZES)
def test_a_fine_tune_of_a_hub_gpt2_runs_its_own_sizes(workdir, monkeypatch, name):
    monkeypatch.setitem(vars(__import__("huggingface_hub")), "hf_hub_download", None)  # nothing downloaded
    assert fine_tune_settings(name) == {**HUB_SIZES[name], "block_size": 1024}


def test_a_local_folder_named_gpt2_is_that_folder_with_its_own_context(workdir, monkeypatch):
    """Not the hub's gpt2: its sizes and its n_positions (64, not 1024) run, and nothing is downloaded."""
    hf = tiny_gpt2()
    hf.save_pretrained("gpt2")
    monkeypatch.setitem(vars(__import__("huggingface_hub")), "hf_hub_download", None)
    assert fine_tune_settings("gpt2") == dict(n_layer=2, n_head=2, n_embd=32, block_size=64)
    assert GPT.from_pretrained("gpt2").config.block_size == 64
    assert_loads_as(hf, "gpt2")


# --- every refusal: a spoiled folder, one line naming the file, no model built ------------------------------

D = "tiny-gpt2"  # the folder, in the test's own directory
CONFIG, WEIGHTS, INDEX = f"{D}/config.json", f"{D}/model.safetensors", f"{D}/model.safetensors.index.json"
SHARDS = [f"{D}/model-0000{i}-of-00002.safetensors" for i in (1, 2)]  # as save_pretrained names them


def write(path, data):
    with open(path, "w" if isinstance(data, str) else "wb") as f:
        f.write(data)


def config(**changes):
    """A spoil: config.json with these changes (None: the key removed)."""
    def spoil():
        values = {**json.load(open(CONFIG)), **changes}
        write(CONFIG, json.dumps({k: v for k, v in values.items() if v is not None}))
    return spoil


def weight(name, value):
    """A spoil: model.safetensors with tensor name made value(the tensor there, or None), or removed."""
    def spoil():
        tensors = load_file(WEIGHTS)
        new = value(tensors.pop(name, None))
        save_file(tensors if new is None else {**tensors, name: new}, WEIGHTS, metadata={"format": "pt"})
    return spoil


def with_nan(w):
    w = w.clone()
    w.view(-1)[3] = float("nan")
    return w


def link(path):
    """A spoil: path becomes a link to its own content, moved out of the folder."""
    def spoil():
        os.rename(path, "elsewhere")
        os.symlink(os.path.abspath("elsewhere"), path)
    return spoil


def only(*names):
    """A spoil: config.json and files of these names (pickled weights, say), no model.safetensors."""
    def spoil():
        os.remove(WEIGHTS)
        for name in names:
            torch.save({"wte.weight": torch.zeros(1)}, f"{D}/{name}")
    return spoil


def sharded(*spoils):
    """A spoil: model.safetensors split into two shards and their index, then these spoils."""
    def spoil():
        tensors = load_file(WEIGHTS)
        os.remove(WEIGHTS)
        names, weight_map = sorted(tensors), {}
        for path, part in zip(SHARDS, (names[:len(names) // 2], names[len(names) // 2:])):
            save_file({n: tensors[n] for n in part}, path, metadata={"format": "pt"})
            weight_map.update(dict.fromkeys(part, os.path.basename(path)))
        write(INDEX, json.dumps({"metadata": {}, "weight_map": weight_map}))
        for then in spoils:
            then()
    return spoil


MLP = f"{CONFIG}: this GPT has GPT-2's MLP only (n_inner = 4·n_embd, the tanh GELU)"
NOT_FINITE = "holds NaN or infinite numbers"
SPOILED = {  # what is wrong: (the spoil, the words of the one line)
    # config.json
    "no config.json": (lambda: os.remove(CONFIG),
                       f"'{D}' is not a directory saved with transformers' save_pretrained (no config.json)"),
    "config.json a link": (link(CONFIG), f"{CONFIG} is a symbolic link, not a regular file"),
    "config.json huge": (lambda: write(CONFIG, '{"model_type": "gpt2"}' + " " * (1 << 20)),
                         f"{CONFIG} is larger than 1,048,576 bytes"),
    "not JSON": (lambda: write(CONFIG, "{not json"), f"{CONFIG} is not JSON"),
    "model_type bert": (config(model_type="bert"), f"{CONFIG} describes model_type 'bert', not 'gpt2'"),
    "n_layer too large": (config(n_layer=10**6),  # refused before a million layers' names are listed
                          f"{D}: config.json says n_layer=1000000 but the weights hold 2 layers"),
    "n_inner": (config(n_inner=64), MLP),
    "relu": (config(activation_function="relu"), MLP),
    "exact GELU": (config(activation_function="gelu"), MLP),
    # the tensors, by name and shape
    "n_layer not the weights'": (config(n_layer=500),
                                 f"{D}: config.json says n_layer=500 but the weights hold 2 layers"),
    "a tensor missing": (weight("transformer.ln_f.bias", lambda w: None), f"{D}: the weights lack ln_f.bias"),
    "a tensor too many": (weight("transformer.h.0.attn.gate", lambda w: torch.zeros(3)),
                          f"{WEIGHTS}: unexpected tensor transformer.h.0.attn.gate"),
    "shapes not config.json's": (config(n_embd=64), f"{WEIGHTS}: transformer.h.0.attn.c_attn.bias has shape "
                                                    "(96,) but config.json implies (192,)"),
    "a tensor of another shape": (weight("transformer.wpe.weight", lambda w: w[:63]),
                                  f"{WEIGHTS}: transformer.wpe.weight has shape (63, 32) but config.json "
                                  "implies (64, 32)"),
    # finite
    "NaN": (weight("transformer.h.1.mlp.c_proj.bias", with_nan),
            f"{WEIGHTS}: transformer.h.1.mlp.c_proj.bias {NOT_FINITE}"),
    "inf": (weight("transformer.wte.weight", lambda w: w.index_fill(0, torch.tensor([7]), float("inf"))),
            f"{WEIGHTS}: transformer.wte.weight {NOT_FINITE}"),
    # the files: safetensors only, regular ones
    "cut short": (lambda: write(WEIGHTS, open(WEIGHTS, "rb").read()[:999]),
                  f"{WEIGHTS} cannot be read as safetensors"),
    "empty": (lambda: write(WEIGHTS, b""), f"{WEIGHTS} cannot be read as safetensors"),
    "pytorch_model.bin": (only("pytorch_model.bin"), f"{D} holds only pickled (or TensorFlow) weights"),
    "tf_model.h5": (only("tf_model.h5"), f"{D} holds only pickled (or TensorFlow) weights"),
    "no weights": (only(), f"'{D}' is not a directory saved with transformers' save_pretrained "
                           "(no model.safetensors)"),
    "weights a link": (link(WEIGHTS), f"{WEIGHTS} is a symbolic link, not a regular file"),
    # shards and their index
    "index not JSON": (sharded(lambda: write(INDEX, '{"weight_map": ')),
                       f"{INDEX} is not a safetensors index"),
    "a shard missing": (sharded(lambda: os.remove(SHARDS[1])), f"{SHARDS[1]} is missing"),
    "a shard a link": (sharded(link(SHARDS[0])), f"{SHARDS[0]} is a symbolic link, not a regular file"),
}


@pytest.mark.parametrize("wrong", SPOILED)
def test_a_spoiled_gpt2_folder_is_one_line_naming_the_file(saved, workdir, monkeypatch, wrong):
    """From sample.py and from GPT.from_pretrained, before any model is built."""
    spoil, words = SPOILED[wrong]
    shutil.copytree(saved[1], D)
    spoil()
    built = []
    monkeypatch.setattr(GPT, "__init__", lambda *args, **kwargs: built.append(1))
    assert words in one_line_error(sample.main, [f"--init_from={D}", "--max_new_tokens=1"])
    with pytest.raises(ConfigError, match=D):
        GPT.from_pretrained(D)
    assert built == []


ACCEPTED = {  # what transformers' own GPT-2 folders may hold, old and new: each loads
    "n_inner spelled out": config(n_inner=4 * SIZES["n_embd"]),
    "no activation_function": config(activation_function=None),  # GPT-2's default: gelu_new
    "older files' attn.masked_bias": lambda: [weight(f"transformer.h.{i}.attn.masked_bias",
                                                     lambda w: torch.tensor(-1e4))() for i in (0, 1)],
}


@pytest.mark.parametrize("kind", ACCEPTED)
def test_gpt2_folders_as_transformers_wrote_them_load(saved, workdir, kind):
    shutil.copytree(saved[1], D)
    ACCEPTED[kind]()
    assert_loads_as(saved[0], D)
