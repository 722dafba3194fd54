"""The exact KV cache of committed blocks, shared by every row whose canvas starts with them.

Under block-causal attention the keys and values of a block depend only on the tokens up to
its end, so a cache entry is named by its content: (prompt, block length, a digest of the
tokens before the boundary). A row forked or repeated from another finds its parent's
entries under the same names and recomputes nothing; two rows that wrote different blocks get
different names. An entry holds one stored chunk (the prompt's whole blocks, or one block) as
one tensor [layers, 2, kv heads, tokens, head dim] and names the entry before it, so a prefix
is one concatenation of a few chunks.

Entries live while their problem does: the engine holds a problem's prompt while it runs and
releases it when it ends (`KeepsState`), and the prompt's entries are freed then. A store
over its byte budget frees the entries of the least recently used other prompt; when one
prompt's own entries do not fit, that is the user's one-line error.
"""

from __future__ import annotations

import hashlib
from collections import OrderedDict
from collections.abc import Sequence
from dataclasses import dataclass

import torch

from dllmbench.core.errors import UserError

Root = tuple[bytes, int]  # (digest of the prompt's tokens, block length)


def prompt_digest(prompt_ids: Sequence[int] | torch.Tensor) -> bytes:
    ids = torch.as_tensor(list(prompt_ids) if not torch.is_tensor(prompt_ids) else prompt_ids)
    return hashlib.blake2b(ids.to(torch.int64).cpu().numpy().tobytes(), digest_size=16).digest()


class Digests:
    """The names of a row's prefixes at block boundaries: digest b names tokens[: b·block]
    (b = 0: the empty prefix), each computed once, when first asked (one hash of the prefix's
    bytes)."""

    def __init__(self, tokens: torch.Tensor, block: int, upto: int):
        self._data = tokens[: upto * block].to(torch.int64).cpu().numpy()
        self.block, self.upto = block, upto
        self._known: dict[int, bytes] = {0: b"root"}

    def __len__(self) -> int:
        return self.upto + 1

    def __getitem__(self, b: int) -> bytes:
        if not 0 <= b <= self.upto:
            raise IndexError(b)
        if b not in self._known:
            piece = self._data[: b * self.block].tobytes()
            self._known[b] = hashlib.blake2b(piece, digest_size=16).digest()
        return self._known[b]


@dataclass
class Entry:
    """One stored chunk: the keys and values of tokens [start, end) of a prefix."""

    parent: bytes | None  # the digest of the entry ending at `start` (None: start is 0)
    start: int
    end: int
    kv: torch.Tensor  # [layers, 2, kv heads, end - start, head dim]

    @property
    def nbytes(self) -> int:
        return self.kv.numel() * self.kv.element_size()


class PrefixStore:
    """Entries by (root, digest of the prefix they end), freed per root."""

    def __init__(self, budget_bytes: int | None = None):
        self.budget = budget_bytes
        self._roots: OrderedDict[Root, dict[bytes, Entry]] = OrderedDict()
        self._holds: dict[bytes, int] = {}
        self.nbytes = 0
        self.peak_bytes = 0
        # whole prefixes the last two forwards read, so that a row's next step reads its
        # prefix again without concatenating its chunks (or from its parent's and one block)
        self._whole: dict[tuple[Root, bytes], torch.Tensor] = {}
        self._read: set[tuple[Root, bytes]] = set()
        self._read_before: set[tuple[Root, bytes]] = set()

    def hold(self, prompt_ids: Sequence[int]) -> None:
        key = prompt_digest(prompt_ids)
        self._holds[key] = self._holds.get(key, 0) + 1

    def release(self, prompt_ids: Sequence[int]) -> None:
        key = prompt_digest(prompt_ids)
        left = self._holds.get(key, 0) - 1
        if left > 0:
            self._holds[key] = left
            return
        self._holds.pop(key, None)
        for root in [r for r in self._roots if r[0] == key]:
            self._drop(root)

    def clear(self) -> None:
        for root in list(self._roots):
            self._drop(root)

    def _drop(self, root: Root) -> None:
        for entry in self._roots.pop(root, {}).values():
            self.nbytes -= entry.nbytes
        for key in [key for key in self._whole if key[0] == root]:
            del self._whole[key]

    def __contains__(self, item: tuple[Root, bytes]) -> bool:
        root, digest = item
        return digest in self._roots.get(root, {})

    def deepest(self, root: Root, digests: Digests, upto: int) -> int:
        """The largest boundary b ≤ upto whose prefix is stored; 0 when none."""
        entries = self._roots.get(root)
        if not entries:
            return 0
        for b in range(upto, 0, -1):
            if digests[b] in entries:
                self._roots.move_to_end(root)
                return b
        return 0

    def prefix(self, root: Root, digest: bytes) -> torch.Tensor | None:
        """The keys and values [layers, 2, kv heads, tokens, head dim] of the prefix that
        `digest` names, from its chain of entries; None for the empty prefix. A prefix read
        by the last two forwards is kept whole; one block past such a prefix is two pieces."""
        key = (root, digest)
        self._read.add(key)
        if key in self._whole:
            return self._whole[key]
        entries = self._roots[root]
        chunks = []
        at: bytes | None = digest
        while at is not None and at in entries:
            if (root, at) in self._whole:
                chunks.append(self._whole[(root, at)])
                break
            entry = entries[at]
            chunks.append(entry.kv)
            at = entry.parent
        if not chunks:
            return None
        chunks.reverse()
        whole = chunks[0] if len(chunks) == 1 else torch.cat(chunks, dim=3)
        self._whole[key] = whole
        return whole

    def settle(self) -> None:
        """A forward ended: whole prefixes neither it nor the one before read are let go."""
        keep = self._read | self._read_before
        for key in [key for key in self._whole if key not in keep]:
            del self._whole[key]
        self._read_before, self._read = self._read, set()

    def put(self, root: Root, digest: bytes, entry: Entry) -> None:
        """Store an entry (an equal one already stored is kept)."""
        entries = self._roots.setdefault(root, {})
        self._roots.move_to_end(root)
        if digest in entries:
            return
        entries[digest] = entry
        self.nbytes += entry.nbytes
        self.peak_bytes = max(self.peak_bytes, self.nbytes)
        while self.budget is not None and self.nbytes > self.budget:
            others = [r for r in self._roots if r != root]
            if not others:
                need = self.nbytes / 2**30
                raise UserError(
                    f"the KV cache of one problem needs {need:.2f} GiB, more than "
                    f"cache_memory={self.budget / 2**30:.2f} GiB; raise cache_memory, or run "
                    "fewer rows per problem or a shorter gen_length"
                )
            self._drop(others[0])  # the least recently used other prompt
