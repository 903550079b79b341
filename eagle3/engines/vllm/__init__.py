"""vLLM's facts (unpinned): its draft loader as data (``profile``)."""
