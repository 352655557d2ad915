"""The results side: the object store (``objects``), the artifact layout of a run in it (``artifacts``),
the upload of finished shards (``sync``) and exports to JSONL / CSV / Parquet (``export``).
"""
