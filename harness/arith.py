"""Integer arithmetic the block and page accounting shares."""


def cdiv(a: int, b: int) -> int:
    """Ceiling division for integers (b > 0): how many blocks of `b` slots hold `a` tokens."""
    return -(-a // b)
