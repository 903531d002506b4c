"""Routing requests to replicas (chapter 10): which of N identical engines gets each request.

``RoundRobin`` deals them in turn. ``CacheAware`` is SGLang's router's rule [sglang-router], restated
over token ids (the router itself matches the prompt's characters):

* the router keeps, for each replica, a tree of the prompts it sent there: an *approximate* picture
  of that replica's prefix cache, kept without asking the replica anything;
* while the load is balanced, a request goes to the replica whose tree matches the longest prefix of
  it, if that match covers more than ``cache_threshold`` of the prompt; otherwise to the replica
  with the smallest tree (the most room in its cache);
* the load is imbalanced when the busiest replica has more than ``balance_abs_threshold`` requests
  more than the idlest *and* more than ``balance_rel_threshold`` times as many: then the idlest
  replica takes the request, whatever it has cached.

The defaults are the router's (sglang-router 0.3.2) [sglang-router]. A policy's ``select(prompt, loads)`` gets the
prompt's token ids and each replica's unfinished requests, and returns the replica's index.
"""

from __future__ import annotations

from itertools import count

ROUTING_POLICIES = ("round_robin", "cache_aware")


class RoundRobin:
    def __init__(self, num_replicas: int):
        self._next = count()
        self.num_replicas = num_replicas

    def select(self, prompt: list[int], loads: list[int]) -> int:
        return next(self._next) % self.num_replicas


class PromptTree:
    """The prompts one replica was sent, as a trie of token ids; its size counts the tokens stored."""

    def __init__(self):
        self.root: dict = {}
        self.size = 0

    def match(self, prompt: list[int]) -> int:
        """How many leading tokens of ``prompt`` some earlier prompt shares."""
        node, matched = self.root, 0
        for token in prompt:
            if token not in node:
                break
            node, matched = node[token], matched + 1
        return matched

    def insert(self, prompt: list[int]) -> None:
        node = self.root
        for token in prompt:
            if token not in node:
                node[token] = {}
                self.size += 1
            node = node[token]


class CacheAware:
    def __init__(
        self,
        num_replicas: int,
        cache_threshold: float = 0.3,
        balance_abs_threshold: int = 64,
        balance_rel_threshold: float = 1.5,
    ):
        self.trees = [PromptTree() for _ in range(num_replicas)]
        self.cache_threshold = cache_threshold
        self.balance_abs_threshold, self.balance_rel_threshold = balance_abs_threshold, balance_rel_threshold
        self.num_cache_routed = 0  # requests sent where the longest match was, for the chapter to count

    def select(self, prompt: list[int], loads: list[int]) -> int:
        most, least = max(loads), min(loads)
        if most - least > self.balance_abs_threshold and most > least * self.balance_rel_threshold:
            choice = loads.index(least)  # imbalanced: the shortest queue
        else:
            matches = [tree.match(prompt) for tree in self.trees]
            best = max(range(len(matches)), key=lambda i: (matches[i], -loads[i]))
            if matches[best] / len(prompt) > self.cache_threshold:
                choice = best
                self.num_cache_routed += 1
            else:
                choice = min(range(len(self.trees)), key=lambda i: self.trees[i].size)
        self.trees[choice].insert(prompt)  # the tree is updated with every request, as the router's is
        return choice


def routing_policy(name: str, num_replicas: int):
    """The policy called ``name`` for ``num_replicas`` replicas."""
    if name == "round_robin":
        return RoundRobin(num_replicas)
    if name == "cache_aware":
        return CacheAware(num_replicas)
    raise ValueError(f"unknown routing policy {name!r}; choose from {', '.join(ROUTING_POLICIES)}")
