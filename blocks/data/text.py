"""``data=text``: byte- or character-level language-model data from text files."""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING, ClassVar

from blocks.data import corpus
from blocks.data.base import DataBlock, TokenBatch
from blocks.spec.registry import register

if TYPE_CHECKING:
    from torch.utils.data import Dataset

    from blocks.core.plan import CheckContext

LEVELS = ("byte", "char")


@register("text")
@dataclass(frozen=True, kw_only=True)
class Text(DataBlock):
    """Next-token data from text files: fixed-length windows over the concatenated corpus.

    The corpus is every file the URL or glob names (any fsspec URL: local, ``s3://``,
    ``memory://``), in sorted order, joined by newlines. The last ``val_fraction`` of it is
    the validation split, so the split never depends on the seed.

    Attributes:
        path: fsspec URL or glob of the text files; empty means the sources of Python's
            ``email`` package, which ship with Python (no download).
        level: ``byte`` (vocabulary of 256, no scan needed) or ``char`` (the corpus's
            distinct characters; the plan reads the corpus to count them).
        seq_len: tokens per sample; each sample predicts its tokens shifted by one.
        val_fraction: share of the corpus, from its end, held out for validation.
    """

    location_fields: ClassVar[tuple[str, ...]] = ("path",)

    split_fields: ClassVar[tuple[str, ...] | None] = ("val_fraction",)

    batch_size: int = 32
    path: str = ""
    level: str = "byte"
    seq_len: int = 128
    val_fraction: float = 0.1

    def vocab_size(self) -> int:
        """256 at byte level; the number of distinct characters at char level."""
        return 256 if self.level == "byte" else len(corpus.corpus_alphabet(self.path))

    def batch_spec(self) -> TokenBatch:
        """Token windows of ``seq_len``."""
        return TokenBatch(vocab_size=self.vocab_size(), seq_len=self.seq_len)

    def prepare(self) -> None:
        """Forget the corpus as this process read it before: each plan sizes and reads the files as they are now."""
        corpus.forget()

    def content_digest(self) -> str:
        """A digest of the corpus bytes (the files ``path`` names, in order)."""
        return corpus.corpus_digest(self.path)

    def split_tokens(self) -> tuple[int, int]:
        """Token counts of the train and val parts of the corpus."""
        if self.level == "byte":
            total = corpus.corpus_size_bytes(self.path)
        else:
            total = len(corpus.corpus_bytes(self.path).decode("utf-8", errors="replace"))
        val = int(total * self.val_fraction)
        return total - val, val

    def num_samples(self, split: str) -> int:
        """Non-overlapping windows of ``seq_len + 1`` tokens (inputs plus the shifted target)."""
        if self.seq_len <= 0:
            return 0
        train, val = self.split_tokens()
        tokens = {"train": train, "val": val}.get(split, 0)  # no test split
        return max(0, (tokens - 1) // self.seq_len)

    def build(self, split: str) -> Dataset:
        """The windows of *split* as a dataset."""
        from blocks.data.datasets import TokenWindows

        return TokenWindows.from_text_block(self, split)

    def check(self, ctx: CheckContext) -> None:
        """The corpus must exist and hold at least one global batch."""
        super().check(ctx)
        ctx.choice("level", self.level, LEVELS)
        ctx.positive("seq_len", self.seq_len)
        ctx.within("val_fraction", self.val_fraction, 0, 1)
        try:
            files = corpus.corpus_files(self.path)
        except Exception as exc:
            ctx.error(
                "path",
                f"cannot list '{self.path}': {exc}",
                "point data.path at readable text files",
                check="corpus-files",
            )
            return
        if not files:
            ctx.error(
                "path",
                f"no files match '{self.path or corpus.default_corpus_glob()}'",
                "set data.path to a file, directory glob (e.g. 'texts/**/*.txt') or fsspec URL",
                check="corpus-files",
            )
