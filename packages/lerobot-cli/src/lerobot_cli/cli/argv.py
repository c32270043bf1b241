"""Split ``argv`` into dotted flags: ``--a.b=v`` and ``--a.b v``; ``-h``/``--help`` noted."""

from __future__ import annotations

from attrs import define, field

from lerobot_cli.cli.errors import UsageError


@define(frozen=True)
class ParsedArgv:
    flags: dict[str, str] = field(factory=dict)
    help: bool = False


def split_argv(argv: list[str]) -> ParsedArgv:
    flags: dict[str, str] = {}
    want_help = False
    i = 0
    while i < len(argv):
        token = argv[i]
        i += 1
        if token in ("-h", "--help"):
            want_help = True
            continue
        if not token.startswith("--") or token == "--":
            raise UsageError(f"unexpected argument {token!r}: every setting is a flag like --steps=1000")
        name, eq, value = token[2:].partition("=")
        if not name:
            raise UsageError(f"malformed flag {token!r}: expected --name=value")
        if not eq:
            if i < len(argv) and not argv[i].startswith("--"):
                value = argv[i]
                i += 1
            else:
                value = "true"  # a bare --flag reads as a boolean switch
        flags[name] = value
    return ParsedArgv(flags=flags, help=want_help)
