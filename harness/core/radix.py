"""A token-level radix tree: the comparison for the paged allocator's block-hash prefix cache.

A block-hash cache can only reuse whole blocks; a radix tree (SGLang's RadixAttention) matches
prefixes token by token. Fed the same prompts in the same order, with nothing evicted, the block
cache's hit rate is at most the tree's, and equal at block size 1.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence


class _Node:
    __slots__ = ("edge", "children")

    def __init__(self, edge: tuple):
        self.edge = edge  # the tokens on the edge into this node
        self.children: dict[int, _Node] = {}  # first token of the child's edge -> child


def _common(edge: tuple, tokens: Sequence[int], start: int) -> int:
    n = min(len(edge), len(tokens) - start)
    i = 0
    while i < n and edge[i] == tokens[start + i]:
        i += 1
    return i


class RadixTree:
    def __init__(self):
        self.root = _Node(())

    def match(self, tokens: Sequence[int]) -> int:
        """Length of the longest prefix of `tokens` already in the tree."""
        node, i = self.root, 0
        while i < len(tokens):
            child = node.children.get(tokens[i])
            if child is None:
                break
            common = _common(child.edge, tokens, i)
            i += common
            if common < len(child.edge):
                break
            node = child
        return i

    def insert(self, tokens: Sequence[int]) -> None:
        tokens = tuple(int(t) for t in tokens)
        node, i = self.root, 0
        while i < len(tokens):
            child = node.children.get(tokens[i])
            if child is None:
                node.children[tokens[i]] = _Node(tokens[i:])
                return
            common = _common(child.edge, tokens, i)
            if common < len(child.edge):  # split the edge where the new tokens diverge
                middle = _Node(child.edge[:common])
                child.edge = child.edge[common:]
                middle.children[child.edge[0]] = child
                node.children[tokens[i]] = middle
                child = middle
            node, i = child, i + common


def radix_hit_rate(prompts: Iterable[Sequence[int]]) -> float:
    """Share of prompt tokens a radix cache of every earlier prompt supplies, requests in order.

    Like the block cache, a hit never covers a prompt's last token (its logits are needed).
    """
    tree, hit, total = RadixTree(), 0, 0
    for prompt in prompts:
        prompt = [int(t) for t in prompt]
        hit += min(tree.match(prompt), len(prompt) - 1)
        total += len(prompt)
        tree.insert(prompt)
    return hit / total if total else 0.0
