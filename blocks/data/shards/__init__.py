"""Token shards: prepared once (``blocks data prepare``), streamed by ``data=stream`` from any fsspec URL.

A shard directory holds ``manifest.json`` (torch-free to read; the plan sizes the job from it),
the tokenizer, and flat little-endian token files, one or more per source file and split.
"""
