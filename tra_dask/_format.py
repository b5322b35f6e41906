"""Small formatting helpers shared by explain(), the pictures and the command."""


def fmt_bytes(n: float) -> str:
    """``1536 -> '1.5 KiB'``.

    >>> fmt_bytes(1536), fmt_bytes(12)
    ('1.5 KiB', '12 B')
    """
    for unit in ("B", "KiB", "MiB", "GiB", "TiB"):
        if abs(n) < 1024 or unit == "TiB":
            return f"{int(n)} B" if unit == "B" else f"{n:.1f} {unit}"
        n /= 1024
    return str(n)
