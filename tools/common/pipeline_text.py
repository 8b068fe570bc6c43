"""Pass pipelines as text: 'a,b{k=v,k2=v2},c' split at its top-level commas, so the commas of an
option list stay with their pass. One definition for the driver's flag check, the walrus pass
manager, the Penguin optimizer and `ncc bisect`; each gives its own meaning to the items.
"""

from __future__ import annotations


def split_pipeline(text: str) -> list[str]:
    """The stripped items of `text` at its top-level commas (an empty item stays, for the caller to
    refuse); ValueError saying which brace when the braces do not balance."""
    items: list[str] = []
    depth, start = 0, 0
    for index, char in enumerate(text):
        if char == "{":
            depth += 1
        elif char == "}":
            depth -= 1
            if depth < 0:
                raise ValueError("unbalanced '}'")
        elif char == "," and depth == 0:
            items.append(text[start:index].strip())
            start = index + 1
    if depth:
        raise ValueError("unbalanced '{'")
    items.append(text[start:].strip())
    return items
