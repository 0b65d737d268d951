"""Processes a command under test left behind: the members of its process group, from /proc."""

from __future__ import annotations

from pathlib import Path


def group_members(pgid: int) -> list[int]:
    """Live processes (zombies too) in process group ``pgid``, from /proc."""
    members = []
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            stat = (entry / "stat").read_text()
        except OSError:  # gone meanwhile
            continue
        fields = stat[stat.rfind(")") + 2:].split()  # state, ppid, pgrp, ...
        if int(fields[2]) == pgid:
            members.append(int(entry.name))
    return members
