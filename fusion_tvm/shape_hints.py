"""Shape hints for symbolic dims: a value, a range or a list of expected values.

``{"N": 8}``, ``{"N": (1, 64)}`` (a range) or ``{"S": [16, 128, 512]}``; from the command
line ``N=8``, ``N=1..64`` or ``S=16,128,512``. A plan is then chosen to be good over the
sample points of every range, not only at one of them.
"""

from __future__ import annotations

import itertools
import math
from collections.abc import Mapping, Sequence

from .errors import UserInputError

Hint = int | tuple[int, int] | Sequence[int]


def parse_hint_text(text: str) -> tuple[str, Hint]:
    """Parse ``NAME=V``, ``NAME=LO..HI`` or ``NAME=A,B,C``."""
    if "=" not in text:
        raise UserInputError(f"bad shape hint '{text}': expected NAME=VALUE, NAME=LO..HI or "
                             "NAME=A,B,C")
    name, value = (part.strip() for part in text.split("=", 1))
    if not name.isidentifier():
        raise UserInputError(f"bad shape hint '{text}': '{name}' is not a dim name")
    try:
        if ".." in value:
            lo, hi = (int(v) for v in value.split("..", 1))
            return name, _check_range(text, lo, hi)
        if "," in value:
            vals = [int(v) for v in value.split(",") if v.strip()]
            return name, _check_values(text, vals)
        return name, _check_values(text, [int(value)])[0]
    except ValueError as err:
        raise UserInputError(f"bad shape hint '{text}': values must be integers") from err


def _check_range(where: str, lo: int, hi: int) -> tuple[int, int]:
    if lo < 1 or hi < lo:
        raise UserInputError(f"bad shape hint '{where}': need 1 <= LO <= HI, got {lo}..{hi}")
    return lo, hi


def _check_values(where: str, vals: list[int]) -> list[int]:
    if not vals or any(v < 1 for v in vals):
        raise UserInputError(f"bad shape hint '{where}': values must be positive integers")
    return vals


def sample_values(hint: Hint, name: str | None = None) -> list[int]:
    """The points at which a hint is evaluated: both ends and the geometric middle
    (``name``: the dim's, for the error message)."""
    bad = UserInputError(f"bad shape hint value {hint!r}"
                         + (f" for dim '{name}'" if name else "")
                         + ": expected an integer, a (lo, hi) range or a list of integers")
    if isinstance(hint, bool) or isinstance(hint, (str, bytes)) or hint is None:
        raise bad
    if isinstance(hint, int):
        return [_check_values(str(hint), [hint])[0]]
    try:
        if isinstance(hint, tuple) and len(hint) == 2:
            lo, hi = _check_range(f"{hint}", _integer(hint[0]), _integer(hint[1]))
            mid = int(round(math.sqrt(lo * hi)))
            return sorted({lo, mid, hi})
        return sorted(set(_check_values(f"{hint}", [_integer(v) for v in hint])))
    except (TypeError, ValueError) as err:
        raise bad from err


def _integer(v) -> int:
    """An integral value (``8``, ``np.int64(8)``, ``8.0``); anything else is a ValueError."""
    if isinstance(v, (bool, str, bytes)) or int(v) != v:
        raise ValueError(f"{v!r} is not an integer")
    return int(v)


def representative(hint: Hint) -> int:
    """One value standing for the hint (the geometric middle of its samples)."""
    vals = sample_values(hint)
    return int(round(math.exp(sum(math.log(v) for v in vals) / len(vals))))


def sample_points(hints: Mapping[str, Hint], limit: int = 9) -> list[dict[str, int]]:
    """Cartesian product of every hint's samples (at most ``limit`` points, evenly kept)."""
    names = sorted(hints)
    grids = [sample_values(hints[n], n) for n in names]
    points = [dict(zip(names, combo, strict=True)) for combo in itertools.product(*grids)]
    if len(points) > limit:
        step = (len(points) - 1) / (limit - 1)
        points = [points[round(i * step)] for i in range(limit)]
    return points


def check_names(hints: Mapping[str, Hint], known: set[str]) -> None:
    """Refuse hints for dims the model does not have."""
    unknown = sorted(set(hints) - known)
    if unknown:
        have = ", ".join(sorted(known)) or "none"
        raise UserInputError(f"shape hint for unknown dim(s) {unknown}; the model's symbolic "
                             f"dims are: {have}")
