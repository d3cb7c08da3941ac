"""Character-level dataset: every position of the corpus starts one (input, next-char target) window."""

from __future__ import annotations

from pathlib import Path

import torch
from torch.utils.data import Dataset


class CharDataset(Dataset[tuple[torch.Tensor, torch.Tensor]]):
    """Windows of block_size characters; the target is the same window shifted by one character.

    The vocabulary is the sorted set of characters in the corpus, so every rank (and every node, reading
    its own copy of the same file) builds the same char <-> id mapping without any communication.
    """

    def __init__(self, text: str, block_size: int) -> None:
        if len(text) <= block_size + 1:
            raise ValueError(
                f"corpus has {len(text)} characters; need more than BLOCK_SIZE+1={block_size + 1}"
            )
        self.chars = sorted(set(text))
        self.stoi = {c: i for i, c in enumerate(self.chars)}
        self.block_size = block_size
        self.data = torch.tensor([self.stoi[c] for c in text], dtype=torch.long)

    @classmethod
    def from_file(cls, path: Path, block_size: int) -> CharDataset:
        return cls(path.read_text(encoding="utf-8"), block_size)

    @property
    def vocab_size(self) -> int:
        return len(self.chars)

    def __len__(self) -> int:
        return len(self.data) - self.block_size

    def __getitem__(self, i: int) -> tuple[torch.Tensor, torch.Tensor]:
        chunk = self.data[i : i + self.block_size + 1]
        return chunk[:-1], chunk[1:]

    def encode(self, s: str) -> torch.Tensor:
        """Ids for s; characters not in the corpus are dropped (prompts are free text)."""
        return torch.tensor([self.stoi[c] for c in s if c in self.stoi], dtype=torch.long)

    def decode(self, ids: torch.Tensor) -> str:
        return "".join(self.chars[i] for i in ids.tolist())
