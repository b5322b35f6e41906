"""Shared by the benchmark scripts: replace one section of benchmarks/README.md."""

from __future__ import annotations

from pathlib import Path

README = Path(__file__).with_name("README.md")


def write_section(title: str, lines: list[str]) -> None:
    """Put ``## title`` followed by ``lines`` into the README, replacing an older
    section of that title and keeping the others."""
    text = README.read_text() if README.exists() else "# Benchmarks\n"
    block = "\n".join([f"## {title}", "", *lines]).rstrip() + "\n\n"
    head = f"## {title}\n"  # the whole title ("## time model" is not "## time model: reading"), at a line's start
    if text.startswith(head):
        start = 0
    else:
        at = text.find("\n" + head)
        start = at + 1 if at >= 0 else -1
    if start >= 0:
        end = text.find("\n## ", start + 1)
        text = text[:start] + block + (text[end + 1:].lstrip("\n") if end >= 0 else "")
    else:
        text = text.rstrip() + "\n\n" + block
    README.write_text(text.rstrip() + "\n")
    print(f"wrote {README}")
