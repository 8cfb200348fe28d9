"""The command-line parser of `vllm serve` and the API server, with vLLM's conveniences:

- `--max_model_len` and `--max-model-len` are the same flag (underscores in a flag's
  name become dashes; values are left alone);
- `--config file.yaml` reads flags from a YAML mapping (`max-model-len: 4k`,
  `enable-prefix-caching: false`, lists as lists); flags given on the command line win;
- `human_readable_int` parses `4k` (4000), `4K` (4096), `1.5m`, `2M`;
- a JSON flag may be given key by key: `--hf-overrides.rope_theta 500000`,
  `--limit-mm-per-prompt.image 0`, nested `--a.b.c 1`, appended to a list with
  `--a.list+ x` (values are read as JSON where they parse, else as strings); they merge
  into the flag's own JSON value when that is given too.
"""
from __future__ import annotations

import argparse
import json
import re
from typing import Any, Optional, Sequence

_DECIMAL = {"k": 10 ** 3, "m": 10 ** 6, "g": 10 ** 9}
_BINARY = {"K": 2 ** 10, "M": 2 ** 20, "G": 2 ** 30}


def human_readable_int(value: str) -> int:
    """An integer with an optional suffix: k/m/g are powers of 1000 (a decimal number is
    allowed, "25.6k" = 25600), K/M/G powers of 1024 (integers only, "2K" = 2048)."""
    m = re.fullmatch(r"\s*(\d+(?:\.\d+)?)([kmgKMG]?)\s*", str(value))
    if m is None:
        raise argparse.ArgumentTypeError(
            f"invalid size {value!r}: expected an integer with an optional k/m/g (x1000) or "
            "K/M/G (x1024) suffix, e.g. 4k or 32K.")
    number, suffix = m.groups()
    if not suffix:
        if "." in number:
            raise argparse.ArgumentTypeError(f"invalid integer {value!r}.")
        return int(number)
    if suffix in _BINARY:
        if "." in number:
            raise argparse.ArgumentTypeError(
                f"invalid size {value!r}: binary suffixes (K/M/G) take integers.")
        return int(number) * _BINARY[suffix]
    scaled = float(number) * _DECIMAL[suffix]
    if scaled != int(scaled):
        raise argparse.ArgumentTypeError(f"invalid size {value!r}: not a whole number.")
    return int(scaled)


class FlexibleArgumentParser(argparse.ArgumentParser):
    """argparse with underscore spellings of flags and `--config FILE.yaml` (see module)."""

    def parse_known_args(self, args: Optional[Sequence[str]] = None,
                         namespace: Optional[argparse.Namespace] = None):
        if args is None:
            import sys
            args = sys.argv[1:]
        args = [_dash_flag(a) for a in args]
        args = self._expand_config(args)
        args = _merge_dotted(args)
        return super().parse_known_args(args, namespace)

    def _expand_config(self, args: list[str]) -> list[str]:
        """Replace `--config FILE` by the file's flags, placed before the first flag of
        the command line so that every flag given there overrides the file."""
        for i, arg in enumerate(args):
            if arg == "--config" or arg.startswith("--config="):
                if arg == "--config":
                    if i + 1 >= len(args):
                        self.error("--config needs a YAML file.")
                    path, rest = args[i + 1], args[:i] + args[i + 2:]
                else:
                    path, rest = arg.split("=", 1)[1], args[:i] + args[i + 1:]
                break
        else:
            return args
        from_file = self._config_flags(path)
        first_flag = next((j for j, a in enumerate(rest) if a.startswith("-")), len(rest))
        return rest[:first_flag] + from_file + rest[first_flag:]

    def _config_flags(self, path: str) -> list[str]:
        import yaml
        try:
            with open(path) as f:
                data = yaml.safe_load(f)
        except (OSError, yaml.YAMLError) as e:
            self.error(f"cannot read --config {path}: {e}")
        if data is None:
            return []
        if not isinstance(data, dict):
            self.error(f"--config {path} must hold a mapping of flag names to values.")
        negatable = self._negatable_flags()
        flags: list[str] = []
        for key, value in data.items():
            flag = "--" + str(key).lstrip("-").replace("_", "-")
            if value is True:
                flags.append(flag)
            elif value is False:
                if flag in negatable:
                    flags.append("--no-" + flag[2:])
            elif isinstance(value, list):
                flags += [flag, *(json.dumps(v) if isinstance(v, dict) else str(v)
                                  for v in value)]
            elif isinstance(value, dict):
                flags += [flag, json.dumps(value)]
            elif value is not None:
                flags += [flag, str(value)]
        return flags

    def _negatable_flags(self) -> set[str]:
        """Flags with a --no- form, in this parser and its sub-commands."""
        found: set[str] = set()
        stack: list[argparse.ArgumentParser] = [self]
        while stack:
            parser = stack.pop()
            for action in parser._actions:
                if isinstance(action, argparse.BooleanOptionalAction):
                    found.update(s for s in action.option_strings if not s.startswith("--no-"))
                elif isinstance(action, argparse._SubParsersAction):
                    stack.extend(action.choices.values())
        return found


def _dash_flag(arg: str) -> str:
    """'--max_model_len=8' -> '--max-model-len=8' (the value is kept as written, and so
    are the keys of a dotted JSON flag: '--hf_overrides.rope_theta')."""
    if not arg.startswith("--") or arg == "--":
        return arg
    name, sep, value = arg.partition("=")
    flag, dot, keys = name[2:].partition(".")
    return "--" + flag.replace("_", "-") + dot + keys + sep + value


def _json_value(text: str) -> Any:
    try:
        return json.loads(text)
    except json.JSONDecodeError:
        return text


def _merge_dotted(args: list[str]) -> list[str]:
    """`--flag.key value` pieces folded into one `--flag '{"key": value}'` per flag (at
    the first piece's place), merged over the flag's own JSON value if it is given."""
    dotted: dict[str, dict] = {}
    first_at: dict[str, int] = {}
    plain: dict[str, int] = {}
    out: list[Any] = []
    gone = object()  # an argument folded into a merged value
    i = 0
    while i < len(args):
        arg = args[i]
        name = arg.partition("=")[0]
        if arg.startswith("--") and "." in name and not name.startswith("--."):
            flag, _, path = name.partition(".")
            if "=" in arg:
                value, i = arg.partition("=")[2], i + 1
            elif i + 1 < len(args):
                value, i = args[i + 1], i + 2
            else:
                raise argparse.ArgumentTypeError(f"{name} needs a value.")
            _set_path(dotted.setdefault(flag, {}), path, _json_value(value))
            if flag not in first_at:
                first_at[flag] = len(out)
                out += [flag, gone]  # the value is filled in below
            continue
        if arg.startswith("--") and "=" not in arg:
            plain[arg] = len(out)
        out.append(arg)
        i += 1
    for flag, values in dotted.items():
        base = {}
        at = plain.get(flag)
        if at is not None and at + 1 < len(out):
            parsed = _json_value(out[at + 1])
            base = parsed if isinstance(parsed, dict) else {}
        merged = _deep_merge(base, values)
        out[first_at[flag] + 1] = json.dumps(merged)
        if at is not None:
            out[at] = out[at + 1] = gone  # superseded by the merged value
    return [a for a in out if a is not gone]


def _set_path(target: dict, path: str, value: Any) -> None:
    keys = path.split(".")
    for key in keys[:-1]:
        target = target.setdefault(key, {})
    last = keys[-1]
    if last.endswith("+"):
        target.setdefault(last[:-1], []).append(value)
    else:
        target[last] = value


def _deep_merge(base: dict, extra: dict) -> dict:
    merged = dict(base)
    for key, value in extra.items():
        if isinstance(value, dict) and isinstance(merged.get(key), dict):
            merged[key] = _deep_merge(merged[key], value)
        else:
            merged[key] = value
    return merged


def parse_json_dict(value: Any) -> dict:
    """A JSON object from the command line (or a dict already, from YAML or Python)."""
    if isinstance(value, dict):
        return value
    try:
        parsed = json.loads(value)
    except (TypeError, json.JSONDecodeError) as e:
        raise argparse.ArgumentTypeError(f"expected a JSON object, got {value!r}: {e}")
    if not isinstance(parsed, dict):
        raise argparse.ArgumentTypeError(f"expected a JSON object, got {value!r}.")
    return parsed
