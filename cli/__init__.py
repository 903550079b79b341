"""The ``eagle3`` command (``main.app``): the top layer, beside ``flows/``; each command is a thin
call into the library or a flow (``run`` drives a flow from the command line)."""
