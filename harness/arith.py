"""Integer arithmetic the block and page accounting shares."""

import math


def cdiv(a: int, b: int) -> int:
    """Ceiling division for integers (b > 0): how many blocks of `b` slots hold `a` tokens."""
    return -(-a // b)


def tensor_parallel_degrees(num_heads: int, num_kv_heads: int) -> list[int]:
    """The tensor-parallel degrees a model splits evenly: those dividing its heads and its K/V heads."""
    both = math.gcd(num_heads, num_kv_heads)
    return [d for d in range(1, both + 1) if both % d == 0]


def causal_pairs(new: int, context: int, window: int = 0) -> int:
    """(query, key) pairs causal attention computes for the last `new` of `context` tokens: the
    query at position k (1-based) reads k keys, or the last `window` of them. A prefill of L
    tokens computes L(L+1)/2, not L x L: a causal kernel skips the masked half."""
    first = context - new + 1  # the first new token's position, 1-based
    if not window or context <= window:
        return (first + context) * new // 2
    if first >= window:
        return new * window
    return (first + window) * (window - first + 1) // 2 + (context - window) * window
