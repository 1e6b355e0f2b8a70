"""Prompt data at scale: the driver holds an index of the rows (where each is, its
prompt's length, its media counts), the ranks and engines read and decode the rows they
encode. rows.py reads rows, lengths.py counts them (in parallel), index.py keeps the
index (and its cache), prompts.py applies the data settings, loader.py draws batches."""

from .loader import StatefulLoader
from .prompts import DrawCheck, PromptDataset, overlong, sized_for_media
from .rows import RowRef, encode_rows, read_records

__all__ = ["DrawCheck", "PromptDataset", "RowRef", "StatefulLoader", "encode_rows", "overlong",
           "read_records", "sized_for_media"]
