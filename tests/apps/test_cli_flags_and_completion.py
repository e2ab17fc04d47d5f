"""The `rlslice` command line: flags anywhere they belong, and completion made from the parser.

Cases:
- `--log-level` works before the subcommand and after it; after it wins; the default is INFO;
- a bad level is refused by argparse (exit 2) naming the choices;
- `rlslice completion bash`, sourced into a real bash, completes subcommand names, a
  subcommand's own options, and skips a `--log-level` value when finding the subcommand;
- the zsh script is the bash one behind `bashcompinit`.
"""

from __future__ import annotations

import shutil
import subprocess

import pytest

from rlslice.apps import completion
from rlslice.apps.cli import build_parser


def test_the_log_level_is_accepted_before_and_after_the_subcommand() -> None:
    parser = build_parser(only="status")
    assert parser.parse_args(["status"]).log_level == "INFO"
    assert parser.parse_args(["--log-level", "DEBUG", "status"]).log_level == "DEBUG"
    assert parser.parse_args(["status", "--log-level", "ERROR"]).log_level == "ERROR"
    assert (
        parser.parse_args(["--log-level", "DEBUG", "status", "--log-level", "WARNING"]).log_level
        == "WARNING"
    )


def test_a_bad_log_level_is_refused_naming_the_choices(capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit) as exited:
        build_parser(only="status").parse_args(["status", "--log-level", "LOUD"])
    assert exited.value.code == 2
    assert "DEBUG" in capsys.readouterr().err


def _complete(line: str) -> list[str]:
    bash = shutil.which("bash")
    assert bash is not None
    words = line.split(" ")
    script = completion.script(build_parser(), "bash")
    program = (
        script
        + f"COMP_WORDS=({' '.join(repr(w) for w in words)}); COMP_CWORD={len(words) - 1}\n"
        + '_rlslice; printf "%s\\n" "${COMPREPLY[@]}"\n'
    )
    done = subprocess.run(
        [bash, "--norc", "-c", program], capture_output=True, text=True, check=True
    )
    return done.stdout.split()


def test_bash_completes_subcommands_and_their_own_options() -> None:
    assert _complete("rlslice sch") == ["scheduler"]
    assert "completion" in _complete("rlslice ")
    up = _complete("rlslice up --")
    assert "--address" in up
    assert "--log-level" in up
    assert _complete("rlslice --log-level DEBUG status --js") == ["--json"]


def test_the_zsh_script_loads_the_bash_one_through_bashcompinit() -> None:
    parser = build_parser()
    zsh = completion.script(parser, "zsh")
    assert zsh.startswith("autoload -U +X bashcompinit && bashcompinit\n")
    assert zsh.endswith(completion.script(parser, "bash"))
