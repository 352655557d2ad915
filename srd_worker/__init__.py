"""srdq worker library: decoding methods, engines, rewards, tasks, runner and storage.

Nothing here does I/O at import time; heavy dependencies (torch, transformers) are imported lazily by the
modules that need them, so the CLI starts fast.
"""

__version__ = "0.1.0"
