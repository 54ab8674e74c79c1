"""Helpers shared by the game modules: grid geometry and unit ability flags."""

from typing import Iterator, Tuple

Position = Tuple[int, int]

# Abilities are bit flags so that one unit can combine several of them.
FLAG_FLYING = 1 << 0
FLAG_RANGED = 1 << 1
FLAG_ARMORED = 1 << 2


def has_flag(flags: int, flag: int) -> bool:
    return (flags & flag) == flag


def manhattan(a: Position, b: Position) -> int:
    return abs(a[0] - b[0]) + abs(a[1] - b[1])


def in_bounds(position: Position, width: int, height: int) -> bool:
    x, y = position
    return 0 <= x < width and 0 <= y < height


def neighbours(position: Position, width: int, height: int) -> Iterator[Position]:
    x, y = position
    for dx, dy in ((1, 0), (-1, 0), (0, 1), (0, -1)):
        candidate = (x + dx, y + dy)
        if in_bounds(candidate, width, height):
            yield candidate


def clamp(value: int, low: int, high: int) -> int:
    return max(low, min(value, high))
