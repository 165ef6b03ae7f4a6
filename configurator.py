"""
The configurator: nanoGPT's way of setting things, with every value checked where it enters.

    python train.py config/train_demo.py --op=attention --max_iters=500

Settings start at a script's defaults. Each config file (Python that assigns names) overrides them, then each
--key=value argument does (the value is read as a Python literal, else taken as text). Each setting is checked
once, here: an unknown key gets a "did you mean", a value of the wrong type or outside its range gets one line
that names the key and says what is allowed. Scripts then read settings as attributes: cfg.learning_rate.
--help prints the script's docstring, then every setting with its default and the comment beside it.
"""
import difflib
import inspect
import math
import numbers
import os
import sys
import tokenize
from ast import literal_eval
from types import SimpleNamespace


class ConfigError(ValueError):
    """A bad setting, explained in one line that says what to do."""


# Rules: what a setting allows beyond the type of its default. Each is a function (key, value) -> value.

def one_of(*choices):
    def rule(key, value):
        if value not in choices:
            raise ConfigError(f"{key}={value!r} is not allowed: choose one of {', '.join(map(str, choices))}")
        return value
    return rule


def at_least(low):
    def rule(key, value):
        if not value >= low:
            raise ConfigError(f"{key}={value!r} is not allowed: it must be ≥ {low}")
        return value
    return rule


def in_range(low, high):
    """low ≤ value < high."""
    def rule(key, value):
        if not low <= value < high:
            raise ConfigError(f"{key}={value!r} is not allowed: it must be in [{low}, {high})")
        return value
    return rule


# a random seed, as train.py and sample.py take it: any 32-bit value, so that train.py's per-iteration seeds
# (seed + 1000003 × iter + rank) stay within the 64 bits torch.manual_seed takes
SEED = in_range(0, 2**32)


def nonempty(key, value):
    if not value.strip():
        raise ConfigError(f"{key} is empty: give a value")
    return value


def optional(kind, rule=None):
    """None, or a value of type kind (that passes rule): for settings whose default is None."""
    def check(key, value):
        if value is None:
            return None
        value = typed(key, value, kind)
        return rule(key, value) if rule else value
    return check


KINDS = {int: "an integer", float: "a number", bool: "True or False", str: "text"}


def typed(key, value, kind):
    if kind in (int, float) and isinstance(value, numbers.Real) and not isinstance(value, bool):
        if kind is float or isinstance(value, numbers.Integral):  # 1 where 1.0 is meant, numpy's numbers too
            value = kind(value)
    if type(value) is not kind:
        raise ConfigError(f"{key}={value!r} is not allowed: it must be {KINDS.get(kind, kind.__name__)}")
    if kind is float and not math.isfinite(value):
        raise ConfigError(f"{key}={value!r} is not allowed: it must be a finite number")
    return value


def check(key, value, defaults, rules):
    """One setting, checked against its default's type and its rule."""
    if key not in defaults:
        close = difflib.get_close_matches(key, defaults, n=3)
        raise ConfigError(f"unknown setting {key!r}" + (f"; did you mean {', '.join(close)}?" if close else
                                                          "; python SCRIPT --help lists them all"))
    if defaults[key] is not None:
        value = typed(key, value, type(defaults[key]))
    return rules[key](key, value) if key in rules else value


def parse_value(text, default):
    try:
        value = literal_eval(text)
    except (SyntaxError, ValueError, TypeError, MemoryError, RecursionError):  # e.g. {[1]: 2}, or nested too deep
        return text  # a bare word: --op=mix
    return text if isinstance(default, str) and not isinstance(value, str) else value  # --out_dir=2024 is text


def configure(defaults, argv, rules=None, files=True, help_from=()):
    """Defaults, then config files (when files=True), then --key=value, whatever their order in argv. Returns
    (cfg, given): the settings as attributes, and the set of keys a config file or the command line set.
    help_from: (prefix, module or class) pairs whose source sets the defaults, for --help (see comments)."""
    rules = rules or {}
    if "-h" in argv or "--help" in argv:
        print_help(defaults, help_from)
        sys.exit(0)
    values, given = dict(defaults), set()
    for arg in argv:
        if not arg.startswith("--") and not files:
            raise ConfigError(f"unexpected argument {arg!r}: settings look like --key=value")
        for key, value in (read_config_file(arg).items() if not arg.startswith("--") else []):
            values[key] = check(key, value, defaults, rules)
            given.add(key)
    for arg in argv:
        if arg.startswith("--"):
            key, eq, text = arg[2:].partition("=")
            if not eq:
                raise ConfigError(f"argument {arg!r} must look like --key=value")
            values[key] = check(key, parse_value(text, defaults.get(key)), defaults, rules)
            given.add(key)
    return SimpleNamespace(**values), given


def comments(source):
    """{name: the comment beside its default} in the source of a module or class: the lines that start with
    a name and = or : (`name = value  # ...`, `name=value,  # ...` in a dict, `name: type = value  # ...`)."""
    try:
        lines = inspect.getsourcelines(source)[0]
    except (OSError, TypeError):  # defined where no source file is (an operator made in a notebook, say)
        return {}
    found, line = {}, []
    for tok in tokenize.generate_tokens(iter(lines).__next__):
        if tok.type in (tokenize.NEWLINE, tokenize.NL):
            line = []
        elif tok.type == tokenize.COMMENT:
            if len(line) > 1 and line[0].type == tokenize.NAME and line[1].string in ("=", ":"):
                found.setdefault(line[0].string, tok.string.lstrip("#").strip())  # the first one: the default
        elif tok.type not in (tokenize.INDENT, tokenize.DEDENT):
            line.append(tok)
    return found


def print_help(defaults, help_from):
    """The script's docstring (how to run it), then one line per setting: its default and what it does, the
    comment beside that default (prefixed, e.g. '(op=mix) ', by where it comes from)."""
    said = {}  # name -> {comment: the prefixes of the sources that say it}
    for prefix, source in help_from:
        for name, comment in comments(source).items():
            said.setdefault(name, {}).setdefault(comment, []).append(prefix)
    settings = {k: f"--{k}={v!r}" for k, v in defaults.items()}
    width = min(36, max(map(len, settings.values())))
    print((sys.modules["__main__"].__doc__ or "").strip() + "\n\nsettings and their defaults:")
    for k, setting in settings.items():
        text = "; ".join("".join(prefixes) + comment for comment, prefixes in said.get(k, {}).items())
        print(f"  {setting:{width}}  {text}".rstrip())


def read_config_file(path):
    """The names a config file assigns (it is Python, like nanoGPT's), as a dict."""
    if not os.path.isfile(path):
        raise ConfigError(f"config file {path!r} not found; pass a file like config/train_demo.py")
    scope = {}
    try:
        with open(path, encoding="utf-8") as f:
            exec(f.read(), scope)
    except (Exception, SystemExit) as e:  # a config file that crashes, or exits, is a bad config file
        raise ConfigError(f"config file {path} failed: {e.__class__.__name__}: {str(e).splitlines()[0] if str(e) else ''}") from None
    return {k: v for k, v in scope.items()
            if not k.startswith("_") and not callable(v) and type(v).__name__ != "module"}
