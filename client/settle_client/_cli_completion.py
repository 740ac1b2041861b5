"""``settle completion bash|zsh``: a completion script made from the parser itself, so it names every
command and option the installed ``settle`` has."""

from __future__ import annotations

import argparse


def _tree(parser: argparse.ArgumentParser, path: str = "") -> dict[str, list[str]]:
    """Command path (``"poison list"``) → the words that may follow it (subcommands and options)."""
    words: list[str] = []
    tree: dict[str, list[str]] = {}
    for action in parser._actions:
        words += [o for o in action.option_strings if o.startswith("--")]
        if isinstance(action, argparse._SubParsersAction):
            for name, sub in action.choices.items():
                words.append(name)
                tree.update(_tree(sub, f"{path} {name}".strip()))
            words += [c for c in getattr(action, "choices", {}) if c not in words]
        elif action.choices and not action.option_strings:
            words += [str(c) for c in action.choices]
    tree[path] = sorted(set(words))
    return tree


def completion_script(parser: argparse.ArgumentParser, shell: str) -> str:
    tree = _tree(parser)
    cases = "\n".join(
        f'        "{path}") words="{" ".join(words)}" ;;' for path, words in sorted(tree.items())
    )
    bash = f"""# settle completion ({shell}): eval "$(settle completion {shell})"
_settle_complete() {{
    local path="" word i words
    for ((i = 1; i < COMP_CWORD; i++)); do
        word="${{COMP_WORDS[i]}}"
        case "$word" in -*) continue ;; esac
        case " $(_settle_words "${{path# }}") " in *" $word "*) path="$path $word" ;; esac
    done
    COMPREPLY=($(compgen -W "$(_settle_words "${{path# }}")" -- "${{COMP_WORDS[COMP_CWORD]}}"))
}}
_settle_words() {{
    local words=""
    case "$1" in
{cases}
    esac
    echo "$words"
}}
"""
    if shell == "zsh":
        return bash + "autoload -U +X bashcompinit && bashcompinit\ncomplete -F _settle_complete settle\n"
    return bash + "complete -F _settle_complete settle\n"
