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


_UNITS = {
    "": 1, "b": 1, "k": 1e3, "kb": 1e3, "m": 1e6, "mb": 1e6, "g": 1e9, "gb": 1e9, "t": 1e12, "tb": 1e12,
    "p": 1e15, "pb": 1e15, "kib": 2**10, "mib": 2**20, "gib": 2**30, "tib": 2**40, "pib": 2**50,
}


def parse_bytes(s: str) -> float:
    """A size written as Dask writes them (``dask.utils.parse_bytes``), without
    importing dask.

    >>> parse_bytes("1GB"), parse_bytes("512 MiB"), parse_bytes("2e3"), parse_bytes("1.5 kB")
    (1000000000.0, 536870912.0, 2000.0, 1500.0)
    """
    text = s.strip().lower().replace(" ", "")
    i = len(text)
    while i and not (text[i - 1].isdigit() or text[i - 1] == "."):
        i -= 1
    number, unit = text[:i], text[i:]
    if unit not in _UNITS:
        raise ValueError(f"unknown unit {unit!r}; valid units: B, kB, MB, GB, TB, KiB, MiB, GiB, TiB")
    try:
        value = float(number) if number else 1.0
    except ValueError:
        raise ValueError(f"{number!r} is not a number") from None
    return value * _UNITS[unit]
