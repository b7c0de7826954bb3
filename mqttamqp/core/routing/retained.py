"""Retained messages: one per topic, found by topic filter through a level tree.

Owns the in-memory retained set.  It does not persist anything itself; the broker
turns each change into a store operation.
"""

from __future__ import annotations

from collections.abc import Iterator

from mqttamqp.core.message import Message
from mqttamqp.core.topics import SYS_PREFIX

__all__ = ["RetainedStore"]


class _Node:
    __slots__ = ("children", "message")

    def __init__(self) -> None:
        self.children: dict[str, _Node] = {}
        self.message: Message | None = None


class RetainedStore:
    def __init__(self) -> None:
        self._root = _Node()
        self._count = 0
        self._bytes = 0
        # The broker's own $SYS messages, counted apart: limits are on clients' ones.
        self._sys_count = 0
        self._sys_bytes = 0

    def __len__(self) -> int:
        return self._count

    @property
    def payload_bytes(self) -> int:
        return self._bytes

    @property
    def sys_count(self) -> int:
        """How many of them are the broker's own ``$SYS`` messages."""
        return self._sys_count

    def get(self, topic: str) -> Message | None:
        node: _Node | None = self._root
        for level in topic.split("/"):
            assert node is not None
            node = node.children.get(level)
            if node is None:
                return None
        return node.message if node is not None else None

    def holds(self, topic: str, payload: bytes) -> bool:
        """Whether ``topic``'s retained message has this payload: ``$SYS`` publishes
        only what changed (``SysTopics``, the bridges' topics)."""
        message = self.get(topic)
        return message is not None and message.payload == payload

    def room_for(self, message: Message, max_count: int, max_bytes: int) -> bool:
        """Would storing ``message`` keep the clients' retained messages (``$SYS`` not
        counted) within the bounds?  A replacement that adds neither messages nor
        bytes always fits."""
        old = self.get(message.topic)
        size = len(message.payload)
        if old is not None and size <= len(old.payload):
            return True
        count = self._count - self._sys_count + (old is None)
        total = (self._bytes - self._sys_bytes + size
                 - (len(old.payload) if old is not None else 0))
        return count <= max_count and total <= max_bytes

    def put(self, message: Message) -> None:
        node = self._root
        for level in message.topic.split("/"):
            child = node.children.get(level)
            if child is None:
                child = node.children[level] = _Node()
            node = child
        system = message.topic.startswith(SYS_PREFIX)
        if node.message is None:
            self._count += 1
            self._sys_count += system
        else:
            self._bytes -= len(node.message.payload)
            if system:
                self._sys_bytes -= len(node.message.payload)
        self._bytes += len(message.payload)
        if system:
            self._sys_bytes += len(message.payload)
        node.message = message.with_retain(True)

    def delete(self, topic: str) -> bool:
        path: list[tuple[_Node, str]] = []
        node = self._root
        for level in topic.split("/"):
            child = node.children.get(level)
            if child is None:
                return False
            path.append((node, level))
            node = child
        if node.message is None:
            return False
        self._count -= 1
        self._bytes -= len(node.message.payload)
        if topic.startswith(SYS_PREFIX):
            self._sys_count -= 1
            self._sys_bytes -= len(node.message.payload)
        node.message = None
        for parent, level in reversed(path):
            child = parent.children[level]
            if child.message is not None or child.children:
                break
            del parent.children[level]
        return True

    def clear(self) -> None:
        self._root = _Node()
        self._count = 0
        self._bytes = 0
        self._sys_count = 0
        self._sys_bytes = 0

    def match(self, topic_filter: str) -> list[Message]:
        """Retained messages whose topic matches ``topic_filter``, sorted by topic."""
        levels = topic_filter.split("/")
        out: list[Message] = []
        self._walk(self._root, levels, 0, out)
        out.sort(key=lambda m: m.topic)
        return out

    def _walk(self, node: _Node, levels: list[str], depth: int, out: list[Message]) -> None:
        if depth == len(levels):
            if node.message is not None:
                out.append(node.message)
            return
        level = levels[depth]
        if level == "#":
            # "a/#" matches "a" itself; a leading '#' skips "$" topics.
            if node.message is not None and depth > 0:
                out.append(node.message)
            for name, child in node.children.items():
                if depth == 0 and name.startswith("$"):
                    continue
                self._collect(child, out)
            return
        if level == "+":
            for name, child in node.children.items():
                if depth == 0 and name.startswith("$"):
                    continue
                self._walk(child, levels, depth + 1, out)
            return
        exact = node.children.get(level)
        if exact is not None:
            self._walk(exact, levels, depth + 1, out)

    def _collect(self, node: _Node, out: list[Message]) -> None:
        stack = [node]
        while stack:
            n = stack.pop()
            if n.message is not None:
                out.append(n.message)
            stack.extend(n.children.values())

    def __iter__(self) -> Iterator[Message]:
        out: list[Message] = []
        self._collect(self._root, out)
        out.sort(key=lambda m: m.topic)
        return iter(out)
