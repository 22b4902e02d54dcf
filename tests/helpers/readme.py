"""The README read as a user does: its shell blocks, and the environment `source .venv/bin/activate` makes."""

from __future__ import annotations

import os
import re
import shlex
import sys
from pathlib import Path

from tests.helpers.common import REPO_ROOT, child_env

README = REPO_ROOT / "README.md"


VENV_BIN = Path(sys.executable).parent


def shell_blocks() -> list[list[str]]:
    """The README's fenced blocks without a language (its shell commands), as lines, comments removed."""
    blocks = re.findall(r"^```\n(.*?)^```", README.read_text(encoding="utf-8"), flags=re.M | re.S)
    return [[line for line in (shlex.join(shlex.split(raw, comments=True)) for raw in block.splitlines()) if line]
            for block in blocks]


def activated_env() -> dict[str, str]:
    """The environment after `source .venv/bin/activate`: the virtual environment's programs first."""
    env = child_env()
    env["PATH"] = os.pathsep.join([str(VENV_BIN), env.get("PATH", "")])
    env["VIRTUAL_ENV"] = str(VENV_BIN.parent)
    return env


def teacher_block() -> list[str]:
    block = [b for b in shell_blocks() if any("data convert" in line for line in b)]
    assert len(block) == 1, "README: one block converts game records"
    return block[0]
