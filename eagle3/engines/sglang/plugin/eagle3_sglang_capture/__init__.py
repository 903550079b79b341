"""SGLang external model package (``SGLANG_EXTERNAL_MODEL_PACKAGE=eagle3_sglang_capture``) used by
the ``sglang`` extraction backend. Runs only inside SGLang's environment; see
:mod:`eagle3_sglang_capture.capture`."""
