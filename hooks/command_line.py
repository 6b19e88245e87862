"""A container's command line as its process gets it: kubelet expands `$(VAR)` from the
container's literal variables, and a `sh -c` script is split as the shell splits it (its `$VAR`
from the same variables, `"$@"` from the arguments after the script). Nothing here knows which
program runs; hooks.runtime finds the Infera entry point in these words."""

import re
import shlex
from typing import Any

SHELLS = ("sh", "bash", "dash", "ash")
SHELL_SEPARATORS = (";", "&", "&&", "|", "||", "\n")
SHELL_VARIABLE = re.compile(r"\$\{(\w+)\}|\$(\w+)")
# A reference no one here can resolve: to a variable from a Secret, or the shell's own.
UNRESOLVED = re.compile(r"\$(\(|\{|\w|@|\*)")
REFERENCE = re.compile(r"\$\$|\$\(([^)]*)\)")


def flag_value(args: list[str], flag: str, shortest: str | None = None) -> str | None:
    """The value argparse would see for `flag` (the last occurrence wins), given as `--flag value`
    or `--flag=value`; with `shortest`, also under any prefix of the flag from it on (argparse's
    abbreviations, where no other option of the parser shares that prefix)."""
    value = None
    for index, arg in enumerate(args):
        name, equals, rest = arg.partition("=")
        if name == flag or (shortest is not None and name.startswith(shortest) and flag.startswith(name)):
            value = rest if equals else args[index + 1] if index + 1 < len(args) else ""
    return value


def literal_values(env: list[dict]) -> dict[str, str]:
    """The variables whose value is written out (a valueFrom is resolved only by kubelet)."""
    return {var["name"]: var["value"] for var in env if "value" in var and "valueFrom" not in var}


def expand(text: str, values: dict[str, str]) -> str:
    """kubelet's `$(VAR)` expansion of a command-line word: `$$` is a `$`, and a name without a
    known value stays as written (so the word stays unknowable here)."""
    return REFERENCE.sub(lambda m: "$" if m.group(0) == "$$" else values.get(m.group(1), m.group(0)), text)


def _shell_words(script: str, positional: list[str], values: dict[str, str]) -> list[str] | None:
    lexer = shlex.shlex(script, posix=True, punctuation_chars=";&|\n")
    lexer.whitespace, lexer.whitespace_split = " \t\r", True
    try:
        words = list(lexer)
    except ValueError:  # unbalanced quotes: the shell would refuse it too
        return None
    expanded: list[str] = []
    for word in words:
        if word in ("$@", "$*"):
            expanded += positional
        else:
            expanded.append(SHELL_VARIABLE.sub(lambda m: values.get(m.group(1) or m.group(2), m.group(0)), word))
    return expanded


def process_words(container: dict[str, Any]) -> list[str] | None:
    """The words the container's command and args become; None for a script the shell would refuse."""
    values = literal_values(list(container.get("env") or []))
    words = [expand(word, values) for word in list(container.get("command") or []) + list(container.get("args") or [])]
    if len(words) >= 3 and words[0].rsplit("/", 1)[-1] in SHELLS and re.fullmatch(r"-[a-z]*c", words[1]):
        return _shell_words(words[2], words[4:], values)
    return words


def commands(words: list[str]) -> list[list[str]]:
    """The commands of a script's words, split at the shell's separators."""
    split: list[list[str]] = [[]]
    for word in words:
        if word in SHELL_SEPARATORS:
            split.append([])
        else:
            split[-1].append(word)
    return split


def command_of(words: list[str]) -> list[str]:
    """The words up to the first shell separator: one command of a script."""
    return commands(words)[0]


def opaque_word(argv: list[str]) -> str | None:
    """The first word the hook cannot expand that stands where a flag could: then what the
    command lacks is unknown (a flag's value may be unknowable without hiding a flag)."""
    return next(
        (
            word
            for i, word in enumerate(argv)
            if UNRESOLVED.search(word) and not (i and argv[i - 1].startswith("--") and "=" not in argv[i - 1])
        ),
        None,
    )


def opaque(argv: list[str]) -> bool:
    return opaque_word(argv) is not None


def substituted(text: str, values: dict[str, str]) -> str:
    """A word or script with the variables the hook knows put in, kubelet's `$(VAR)` and the
    shell's `$VAR` alike: what it may say, for finding which spec field says something."""
    return SHELL_VARIABLE.sub(lambda m: values.get(m.group(1) or m.group(2), m.group(0)), expand(text, values))
