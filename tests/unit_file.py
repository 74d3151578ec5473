"""Reading a systemd unit as systemd does, for the tests of the shipped one: its [Service] settings (a key
given twice keeps the last, as configparser's strict=False does), Environment='s assignments (quotes kept
together) and ExecStart's argv with `$NAME` split on whitespace as systemd(5) expands an unquoted variable."""

from __future__ import annotations

import configparser
import shlex


def service(text: str) -> configparser.SectionProxy:
    parser = configparser.ConfigParser(strict=False, interpolation=None, delimiters=("=",))
    parser.optionxform = str  # type: ignore[assignment,method-assign]  # systemd's keys are case-sensitive
    parser.read_string(text)
    return parser["Service"]


def environment(unit: configparser.SectionProxy) -> dict[str, str]:
    return dict(a.partition("=")[::2] for a in shlex.split(unit["Environment"]))


def exec_argv(unit: configparser.SectionProxy) -> list[str]:
    env = environment(unit)
    return [w for word in shlex.split(unit["ExecStart"])
            for w in (env[word[1:]].split() if word.startswith("$") else [word])]
