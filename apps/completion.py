"""`rlslice completion bash|zsh`: a shell completion script made from the parser itself.

The script completes subcommand names and each subcommand's options, so it can never drift
from the flags `rlslice` accepts: it is derived from the same argparse tree. zsh loads it
through `bashcompinit`. Install it with, for example:

    rlslice completion bash > /etc/bash_completion.d/rlslice
    echo 'source <(rlslice completion zsh)' >> ~/.zshrc
"""

from __future__ import annotations

import argparse
import shlex
import sys


def configure(parser: argparse.ArgumentParser) -> None:
    """Flags of `rlslice completion`."""
    parser.add_argument("shell", choices=["bash", "zsh"], help="the shell to complete for")


def run(args: argparse.Namespace) -> int:
    """Print the completion script for `args.shell`."""
    from rlslice.apps.cli import build_parser

    sys.stdout.write(script(build_parser(), args.shell))
    return 0


def options_of(parser: argparse.ArgumentParser) -> list[str]:
    """Every option string of `parser` (`--address`, `-h`, ...), in declaration order."""
    return [flag for action in parser._actions for flag in action.option_strings]


def subcommands_of(parser: argparse.ArgumentParser) -> dict[str, argparse.ArgumentParser]:
    """The subcommand parsers of `parser`, by name."""
    for action in parser._actions:
        if isinstance(action, argparse._SubParsersAction):
            return dict(action.choices)
    return {}


def script(parser: argparse.ArgumentParser, shell: str) -> str:
    """The completion script of `parser` for `shell` (`bash` or `zsh`)."""
    commands = subcommands_of(parser)
    top = " ".join([*commands, *options_of(parser)])
    cases = "\n".join(
        f"    {shlex.quote(name)}) words={shlex.quote(' '.join(options_of(sub)))} ;;"
        for name, sub in commands.items()
    )
    body = f"""_rlslice() {{
  local cur="${{COMP_WORDS[COMP_CWORD]}}" command="" words="" i
  for ((i = 1; i < COMP_CWORD; i++)); do
    case "${{COMP_WORDS[i]}}" in
      --log-level) ((i++)) ;;
      -*) ;;
      *) command="${{COMP_WORDS[i]}}"; break ;;
    esac
  done
  case "$command" in
    "") words={shlex.quote(top)} ;;
{cases}
  esac
  COMPREPLY=($(compgen -W "$words" -- "$cur"))
}}
complete -o default -F _rlslice rlslice
"""
    if shell == "zsh":
        return "autoload -U +X bashcompinit && bashcompinit\n" + body
    return body
