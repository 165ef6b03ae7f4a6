"""
The configurator: nanoGPT's way of setting things, with every value checked where it enters.

    python train.py config/train_demo.py --op=attention --max_iters=500

Settings start at a script's defaults; config files (Python that assigns names), then --key=value
arguments (text settings as typed, the rest Python literals) override them. Each is checked once,
here: an unknown key gets "did you mean", a bad value one line naming the key and what it allows.
Scripts read cfg.learning_rate. --help prints the script's docstring, then every setting with its
default and the comment beside it. It opens with open_regular, the one way every script opens a file
it parses or writes (config files too).
"""
import difflib
import inspect
import io
import math
import numbers
import os
import re
import stat
import sys
from ast import literal_eval
from types import SimpleNamespace


class ConfigError(ValueError):
    """A bad setting, explained in one line that says what to do."""


def version(text):
    """(major, minor) of a version string: "2.6.0+cu124" -> (2, 6)."""
    return tuple(int(n) for n in re.findall(r"\d+", text)[:2])


def require_torch(torch_version):  # one line, not a traceback from inside torch
    if version(torch_version) < (2, 6):
        raise ConfigError(f"nanoCorridor needs torch >= 2.6, this is torch {torch_version}: "
                          "pip install -U torch")


def why(e):
    """An exception in a few words: its type and the first line of its message."""
    return f"{type(e).__name__}: {(str(e).splitlines() or [''])[0][:150]}"


# -----------------------------------------------------------------------------
# Every file we parse or write is opened here. A folder someone hands us (a dataset, a run
# directory) may hold a link to /dev/zero (reads forever), a FIFO (blocks forever) or a link to a
# file a write would overwrite: so the open follows no final symbolic link (O_NOFOLLOW), waits on no
# FIFO (O_NONBLOCK), and must find a regular file. Folders on the way are followed: the user named
# them (data/ may well live on another disk).

SAFE_FLAGS = getattr(os, "O_NOFOLLOW", 0) | getattr(os, "O_NONBLOCK", 0) | getattr(os, "O_BINARY", 0)
OPEN_FLAGS = {"rb": os.O_RDONLY,  # read
              # read and append, creating it if missing (a lock)
              "ab+": os.O_RDWR | os.O_CREAT | os.O_APPEND,
              "wb": os.O_WRONLY | os.O_CREAT | os.O_EXCL}  # a new file: fails on anything there
KINDS_OF_FILE = {stat.S_ISDIR: "a folder", stat.S_ISFIFO: "a FIFO (named pipe)", stat.S_ISCHR: "a device",
                 stat.S_ISBLK: "a device", stat.S_ISSOCK: "a socket", stat.S_ISLNK: "a symbolic link"}


def not_regular(path):
    mode = os.lstat(path).st_mode  # lstat: a link itself
    kind = next((name for test, name in KINDS_OF_FILE.items() if test(mode)), "of another kind")
    return ConfigError(f"{path} is {kind}, not a regular file (only regular files are read or written, never "
                       "through a link)")


def refuse_unless_regular(path):
    if os.path.lexists(path) and not stat.S_ISREG(os.lstat(path).st_mode):
        raise not_regular(path)


def open_regular(path, mode="rb", encoding=None):
    """open(path, mode) for a regular file only (a link, folder, FIFO or device is refused): "rb"
    reads, "ab+" reads and appends, creating it, "wb" creates a new one (atomic_write's temporary,
    a fresh name: anything there is refused); encoding: a text file."""
    try:
        fd = os.open(path, OPEN_FLAGS[mode] | SAFE_FLAGS, 0o666)
    except OSError:  # a link (ELOOP), a folder to write, ...: named for what it is
        refuse_unless_regular(path)
        raise
    if not stat.S_ISREG(os.fstat(fd).st_mode):
        os.close(fd)
        raise not_regular(path)
    f = os.fdopen(fd, mode)
    return f if encoding is None else io.TextIOWrapper(f, encoding=encoding)


def read_regular(path, limit):
    """The bytes of the regular file path (as open_regular), refusing one larger than limit bytes:
    for small metadata files, which a file of gigabytes could otherwise make us read until memory
    runs out."""
    with open_regular(path) as f:
        data = f.read(limit + 1)
    if len(data) > limit:
        raise ConfigError(f"{path} is larger than {limit:,} bytes, far more than such a file ever holds; it "
                          "was replaced or comes from elsewhere")
    return data


# -----------------------------------------------------------------------------
# Rules: what a setting allows beyond the type of its default. Each is a function (key, value) ->
# value.

def requires(allowed, says):
    def rule(key, value):
        if not allowed(value):
            raise ConfigError(f"{key}={value!r} is not allowed: {says}")
        return value
    return rule


def one_of(*choices):
    return requires(lambda value: value in choices, f"choose one of {', '.join(map(str, choices))}")


def at_least(low):
    return requires(lambda value: value >= low, f"it must be ≥ {low}")


def in_range(low, high):
    return requires(lambda value: low <= value < high, f"it must be in [{low}, {high})")


# a random seed, as train.py and sample.py take it: any 32-bit value, so that train.py's
# per-iteration seeds (seed + 1000003 × iter + rank) stay within the 64 bits torch.manual_seed takes
SEED = in_range(0, 2**32)


def nonempty(key, value):
    if not value.strip():
        raise ConfigError(f"{key} is empty: give a value")
    return value


def optional(kind, rule=None):
    """None, or a value of type kind (that passes rule), whatever the default (sample.py's
    top_k=None)."""
    def check(key, value):
        if value is None:
            return None
        value = typed(key, value, kind)
        return rule(key, value) if rule else value
    check.allows_none = True
    return check


KINDS = {int: "an integer", float: "a number", bool: "True or False", str: "text"}


def typed(key, value, kind):
    if kind in (int, float) and isinstance(value, numbers.Real) and not isinstance(value, bool):
        # 1 where 1.0 is meant, numpy's numbers too
        if kind is float or isinstance(value, numbers.Integral):
            value = kind(value)
    if type(value) is not kind:
        raise ConfigError(f"{key}={value!r} is not allowed: it must be {KINDS.get(kind, kind.__name__)}")
    if kind is float and not math.isfinite(value):
        raise ConfigError(f"{key}={value!r} is not allowed: it must be a finite number")
    return value


def check(key, value, defaults, rules):
    if key not in defaults:
        close = difflib.get_close_matches(key, defaults, n=3)
        raise ConfigError(f"unknown setting {key!r}" + (f"; did you mean {', '.join(close)}?" if close else
                                                          "; python SCRIPT --help lists them all"))
    rule = rules.get(key)
    if defaults[key] is not None and not getattr(rule, "allows_none", False):  # optional types it
        value = typed(key, value, type(defaults[key]))
    return rule(key, value) if rule else value


def parse_value(text, default):
    # a text setting takes the text as typed: --text='"a"' keeps its quotes, --out_dir=2024 is a
    # name
    try:
        return text if isinstance(default, str) else literal_eval(text)
    except (SyntaxError, ValueError, TypeError):
        return text  # a bare word, or not a value: {[1]: 2}


def configure(defaults, argv, rules=None, files=True, help_from=()):
    """Defaults, then config files (when files=True), then --key=value, whatever their order in
    argv. Returns (cfg, given): the settings as attributes, and the set of keys a config file or the
    command line set. help_from: (prefix, module or class) pairs whose source sets the defaults, for
    --help (see comments)."""
    rules = rules or {}
    if "-h" in argv or "--help" in argv:
        print_help(defaults, help_from)
        sys.exit(0)
    given = {}  # key -> its checked value, for every key a config file or the command line sets
    # first: `--max_iters 5` is one setting without its value, not a config file named 5
    for arg in argv:
        if arg.startswith("--") and "=" not in arg:
            raise ConfigError(f"argument {arg!r} must look like --key=value, with '=' and no space: "
                              f"{arg}=VALUE")
    for path in [arg for arg in argv if not arg.startswith("--")]:
        if not files:
            raise ConfigError(f"unexpected argument {path!r}: settings look like --key=value")
        for key, value in read_config_file(path).items():
            given[key] = check(key, value, defaults, rules)
    for key, _, text in [arg[2:].partition("=") for arg in argv if arg.startswith("--")]:
        given[key] = check(key, parse_value(text, defaults.get(key)), defaults, rules)
    return SimpleNamespace(**{**defaults, **given}), set(given)


def comments(source):
    """{name: the comment beside its default} in the source of a module or class, and of the classes
    a class inherits from its own module (its own comment first): the lines that start with a name
    and = or : (`name = value # ...`, `name=value, # ...` in a dict, `name: type = value # ...`)."""
    found, parts = {}, [source]
    # an operator's controls may be declared by the class it inherits from
    if inspect.isclass(source):
        parts = [c for c in source.__mro__ if c.__module__ == source.__module__]
    for part in parts:
        try:
            lines = inspect.getsourcelines(part)[0]
        except (OSError, TypeError):
            # defined where no source file is (an operator made in a notebook, say)
            continue
        for line in lines:
            # name = or name:, then code (a "#" in a quoted default is text), then its comment
            m = re.match(r"""\s*(\w+)\s*[=:](?:[^#'"]|'[^']*'|"[^"]*")*#(.*)""", line)
            if m:
                found.setdefault(m[1], m[2].strip())
    return found


def print_help(defaults, help_from):
    """The script's docstring (how to run it), then one line per setting: its default and what it
    does, the comment beside that default (prefixed, e.g. '(op=mix) ', by where it comes from)."""
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
    try:
        f = open_regular(path, encoding="utf-8")
    except (FileNotFoundError, NotADirectoryError):  # config/nope.py, train.py/x.py
        raise ConfigError(f"config file {path!r} not found; pass a file like config/train_demo.py "
                          "(settings are written --key=value)") from None
    except ConfigError as e:  # a folder or a FIFO, say: it is named for what it is
        raise ConfigError(f"config file {e}; pass a file like config/train_demo.py") from None
    scope = {}
    with f:
        try:
            exec(f.read(), scope)
        except (Exception, SystemExit) as e:
            # a config file that crashes, or exits, is a bad config file
            if path.endswith(".json"):  # a run's config.json, say
                raise ConfigError(f"config file {path} is JSON, but config files are Python (like "
                                  "config/train_demo.py); a run's own settings resume with "
                                  "--init_from=resume --out_dir=ITS_FOLDER") from None
            raise ConfigError(f"config file {path} failed: {why(e)}") from None
    return {k: v for k, v in scope.items()
            if not k.startswith("_") and not callable(v) and type(v).__name__ != "module"}
