"""How the console shows a message's payload: as text, pretty JSON or a hex dump
(``payload_view``, with the modes possible and whether it was cut), as a one-line
preview for tables, and raw (base64) with its text for the JSON API.

Pure functions of the bytes; escaping is the templates' and ``json.dumps``'s job.
"""

from __future__ import annotations

import base64
import binascii
import json
from typing import Any

__all__ = ["MAX_PAYLOAD_VIEW", "payload_view", "payload_preview", "payload_json"]

PREVIEW_BYTES = 256
MAX_PAYLOAD_VIEW = 256 * 1024


def _is_text(payload: bytes) -> str | None:
    try:
        text = payload.decode("utf-8")
    except UnicodeDecodeError:
        return None
    if any(ord(c) < 32 and c not in "\t\r\n" for c in text):
        return None
    return text


def _hex(payload: bytes) -> str:
    """Hex dump: 16 bytes a line, offset, hex and printable ASCII."""
    lines = []
    for i in range(0, len(payload), 16):
        chunk = payload[i:i + 16]
        hexpart = " ".join(f"{b:02x}" for b in chunk)
        text = "".join(chr(b) if 32 <= b < 127 else "." for b in chunk)
        lines.append(f"{i:08x}  {hexpart:<47}  {text}")
    return "\n".join(lines)


def payload_view(payload: bytes, mode: str = "auto", limit: int = MAX_PAYLOAD_VIEW
                 ) -> dict[str, Any]:
    """How to show ``payload``: mode is text, hex or json ("auto" picks one).

    The result has the mode actually used, the text to show, whether it was cut at
    ``limit`` bytes, and which modes are possible.
    """
    truncated = len(payload) > limit
    shown = payload[:limit]
    text = _is_text(shown)
    pretty: str | None = None
    if text is not None and not truncated:
        try:
            pretty = json.dumps(json.loads(text), indent=2, ensure_ascii=False,
                                sort_keys=False)
        except ValueError:
            pretty = None
    modes = ["hex"]
    if text is not None:
        modes.insert(0, "text")
    if pretty is not None:
        modes.insert(1, "json")
    if mode not in modes:
        mode = "json" if pretty is not None else ("text" if text is not None else "hex")
    body = {"text": text, "json": pretty, "hex": _hex(shown)}[mode]
    return {"mode": mode, "body": body or "", "truncated": truncated, "modes": modes,
            "size": len(payload)}


def payload_preview(payload: bytes, limit: int = 80) -> dict[str, Any]:
    """A one-line preview: text if it is text, else hex; cut at ``limit`` chars."""
    text = _is_text(payload[:PREVIEW_BYTES])
    if text is not None:
        one_line = " ".join(text.split())
        return {"kind": "text", "value": one_line[:limit],
                "cut": len(one_line) > limit or len(payload) > PREVIEW_BYTES}
    hexed = binascii.hexlify(payload[:limit // 2], " ").decode()
    return {"kind": "hex", "value": hexed, "cut": len(payload) > limit // 2}


def payload_json(payload: bytes) -> dict[str, Any]:
    return {"payload_base64": base64.b64encode(payload).decode(),
            "payload_text": _is_text(payload), "size": len(payload)}
