"""The two questions the harness asks git: which commit the harness checkout is at (recorded on every
run), and which commit a branch points at (the run selector latest-on-<branch>)."""

from __future__ import annotations

import subprocess
from functools import cache
from pathlib import Path

TIMEOUT_S = 10


@cache
def git_sha() -> str | None:
    """The harness checkout's commit (with '-dirty' when it has uncommitted changes), if any."""
    root = Path(__file__).resolve().parents[2]
    try:
        sha = _git(["rev-parse", "HEAD"], root, check=True).stdout.strip()
        dirty = _git(["status", "--porcelain", "--untracked-files=no"], root, check=True).stdout.strip()
    except (OSError, subprocess.SubprocessError):
        return None
    return sha + ("-dirty" if dirty else "")


def branch_tip(branch: str, cwd: Path | None = None) -> str:
    """The commit `branch` points at in the repository at cwd; LookupError saying why when there is none."""
    if not branch or branch.startswith("-"):
        raise LookupError(f"'latest-on-{branch}': name a branch, e.g. latest-on-main")
    try:
        done = _git(["rev-parse", "--verify", "--quiet", f"{branch}^{{commit}}"], cwd)
    except (OSError, subprocess.SubprocessError) as exc:
        raise LookupError(f"cannot run git to resolve '{branch}': {exc}") from None
    if done.returncode != 0:
        raise LookupError(f"git cannot resolve branch '{branch}' in {cwd or Path.cwd()}")
    return done.stdout.strip()


def _git(arguments: list[str], cwd: Path | None, check: bool = False) -> subprocess.CompletedProcess[str]:
    return subprocess.run(["git", *arguments], cwd=cwd, capture_output=True, text=True, timeout=TIMEOUT_S, check=check)
