"""SGLang's pinned facts: its draft loader as data (``profile``), its draft forward re-implemented
in torch (``draft``, ``draft_load``), where its interpreter is (``environment``), and the plugin
that runs inside it (``plugin/``)."""
