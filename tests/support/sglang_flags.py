"""The command-line flags of an SGLang release, read statically from its source (tests only)."""

from __future__ import annotations

import ast


def server_flags(source) -> dict[str, str]:
    """``{option string: canonical option}`` of ``python -m sglang.launch_server`` read from
    ``source`` (an :class:`eagle3.engines.sglang.source.EngineSource`): every field annotated
    ``A[T, "help"]`` or ``A[T, Arg(...)]`` without ``no_cli`` of the dataclasses the parser is built
    from (``server_args._INPUT_NAMESPACES`` in ``arg_groups/fields/*.py`` where that exists, else
    ``ServerArgs`` itself; ``arg_utils.add_cli_args_from_dataclass``: the name is ``cli_name`` or
    ``--field-name``, plus ``aliases``), and every ``parser.add_argument`` of
    ``ServerArgs.add_cli_args`` (an option with ``dest=`` of another flag's field counts as that
    flag)."""
    server_args = ast.parse(source.read("sglang/srt/server_args.py"))
    namespaces = ["ServerArgs"]
    for node in server_args.body:
        target = getattr(node.targets[0], "id", "") if isinstance(node, ast.Assign) else ""
        if target == "_INPUT_NAMESPACES":
            namespaces = [e.id for e in node.value.elts]
    modules = [server_args] + [ast.parse(source.read(p))
                               for p in source.list("sglang/srt/arg_groups/fields/")]
    flags: dict[str, str] = {}
    for tree in modules:
        for cls in tree.body:
            if not isinstance(cls, ast.ClassDef) or cls.name not in namespaces:
                continue
            for st in cls.body:
                flags.update(_field_flags(st))
    for node in ast.walk(server_args):
        if isinstance(node, ast.FunctionDef) and node.name == "add_cli_args":
            for call in ast.walk(node):
                if isinstance(call, ast.Call) and getattr(call.func, "attr", "") == "add_argument":
                    names = [a.value for a in call.args if isinstance(a, ast.Constant)]
                    dest = next((ast.literal_eval(k.value) for k in call.keywords
                                 if k.arg == "dest"), None)
                    canon = "--" + dest.replace("_", "-") if dest else names[0]
                    flags.update({name: flags.get(canon, canon) for name in names})
    return flags


def _field_flags(st: ast.stmt) -> dict[str, str]:
    ann = getattr(st, "annotation", None)
    if not isinstance(ann, ast.Subscript) or getattr(ann.value, "id", "") != "A":
        return {}
    meta = ann.slice.elts[1:] if isinstance(ann.slice, ast.Tuple) else []
    cli, aliases = "--" + st.target.id.replace("_", "-"), []
    for m in meta:
        if isinstance(m, ast.Call) and getattr(m.func, "id", "") == "Arg":
            kw = {k.arg: ast.literal_eval(k.value) for k in m.keywords
                  if k.arg in ("no_cli", "cli_name", "aliases")}
            if kw.get("no_cli"):
                return {}
            cli, aliases = kw.get("cli_name") or cli, kw.get("aliases") or []
            return {name: cli for name in [cli, *aliases]}
        if isinstance(m, (ast.Constant, ast.JoinedStr, ast.BinOp)):
            return {cli: cli}
    return {}
