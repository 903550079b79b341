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
    flag); ``action=argparse.BooleanOptionalAction`` adds ``--no-<name>`` for each name."""
    server_args = ast.parse(source.read("sglang/srt/server_args.py"))
    namespaces = ["ServerArgs"]
    for node in server_args.body:
        target = getattr(node.targets[0], "id", "") if isinstance(node, ast.Assign) else ""
        if target == "_INPUT_NAMESPACES":
            namespaces = [e.id for e in node.value.elts]
    modules = [server_args] + [
        ast.parse(source.read(p)) for p in source.list("sglang/srt/arg_groups/fields/")
    ]
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
                    dest = next(
                        (ast.literal_eval(k.value) for k in call.keywords if k.arg == "dest"), None
                    )
                    canon = "--" + dest.replace("_", "-") if dest else names[0]
                    flags.update({name: flags.get(canon, canon) for name in names})
                    action = next((k.value for k in call.keywords if k.arg == "action"), None)
                    if action is not None and _action_name(action) == "BooleanOptionalAction":
                        flags.update({"--no-" + n[2:]: flags.get(canon, canon) for n in names})
    return flags


def _field_flags(st: ast.stmt) -> dict[str, str]:
    ann = getattr(st, "annotation", None)
    if not isinstance(ann, ast.Subscript) or getattr(ann.value, "id", "") != "A":
        return {}
    meta = ann.slice.elts[1:] if isinstance(ann.slice, ast.Tuple) else []
    cli, aliases = "--" + st.target.id.replace("_", "-"), []
    for m in meta:
        if isinstance(m, ast.Call) and getattr(m.func, "id", "") == "Arg":
            kw = {
                k.arg: ast.literal_eval(k.value)
                for k in m.keywords
                if k.arg in ("no_cli", "cli_name", "aliases")
            }
            if kw.get("no_cli"):
                return {}
            cli, aliases = kw.get("cli_name") or cli, kw.get("aliases") or []
            names = [cli, *aliases]
            action = next((k.value for k in m.keywords if k.arg == "action"), None)
            if action is not None and _action_name(action) == "BooleanOptionalAction":
                names += ["--no-" + n[2:] for n in names]  # argparse adds the negation
            return {name: cli for name in names}
        if isinstance(m, (ast.Constant, ast.JoinedStr, ast.BinOp)):
            return {cli: cli}
    return {}


_NO_VALUE_ACTIONS = {
    "store_true",
    "store_false",
    "store_const",
    "BooleanOptionalAction",
    "DeprecatedAction",
    "DeprecatedStoreTrueAction",
    "DeprecatedStoreConstAction",
}


def server_flag_nargs(source) -> dict[str, str]:
    """``{option string: nargs}`` of every option of ``python -m sglang.launch_server`` that does
    not take exactly one value, read from ``source`` as :func:`server_flags` reads the names:
    ``"0"`` (a switch: ``bool`` / ``Optional[bool]`` fields are ``store_true``; the actions of
    :data:`_NO_VALUE_ACTIONS`; ``BooleanOptionalAction`` adds ``--no-<flag>``), ``"?"``, ``"*"``
    or ``"+"`` (``list`` fields without ``type_parser``: ``Arg.nargs`` or ``"+"``; otherwise an
    explicit ``nargs``), following ``arg_utils.add_cli_args_from_dataclass``."""
    server_args = ast.parse(source.read("sglang/srt/server_args.py"))
    namespaces = ["ServerArgs"]
    for node in server_args.body:
        target = getattr(node.targets[0], "id", "") if isinstance(node, ast.Assign) else ""
        if target == "_INPUT_NAMESPACES":
            namespaces = [e.id for e in node.value.elts]
    modules = [server_args] + [
        ast.parse(source.read(p)) for p in source.list("sglang/srt/arg_groups/fields/")
    ]
    out: dict[str, str] = {}
    for tree in modules:
        for cls in tree.body:
            if isinstance(cls, ast.ClassDef) and cls.name in namespaces:
                for st in cls.body:
                    out.update(_field_nargs(st))
    for node in ast.walk(server_args):
        if isinstance(node, ast.FunctionDef) and node.name == "add_cli_args":
            for call in ast.walk(node):
                if isinstance(call, ast.Call) and getattr(call.func, "attr", "") == "add_argument":
                    names = [a.value for a in call.args if isinstance(a, ast.Constant)]
                    kw = {k.arg: k.value for k in call.keywords}
                    out.update(_nargs_of(names, kw.get("action"), kw.get("nargs", _ABSENT)))
    return out


_ABSENT = object()


def _action_name(node) -> str:
    if isinstance(node, ast.Constant):
        return node.value
    return getattr(node, "attr", None) or getattr(node, "id", "")


def _nargs_of(names: list[str], action, nargs) -> dict[str, str]:
    """nargs of an ``add_argument(*names, action=..., nargs=...)`` (AST nodes; ``nargs`` may be
    :data:`_ABSENT`); exactly one value is left out."""
    if nargs is not _ABSENT:
        value = ast.literal_eval(nargs)
        return {} if value is None or value == 1 else {n: str(value) for n in names}
    act = _action_name(action) if action is not None else "store"
    if act not in _NO_VALUE_ACTIONS:
        return {}
    if act == "BooleanOptionalAction":
        names = names + ["--no-" + n[2:] for n in names if n.startswith("--")]
    return {n: "0" for n in names}


def _unwrap(node):
    """``X`` of ``Optional[X]`` / ``X | None`` (AST), else ``node``."""
    if isinstance(node, ast.Subscript) and getattr(node.value, "id", "") == "Optional":
        return node.slice
    if isinstance(node, ast.BinOp) and isinstance(node.op, ast.BitOr):
        parts = [
            p
            for p in (node.left, node.right)
            if not (isinstance(p, ast.Constant) and p.value is None)
        ]
        if len(parts) == 1:
            return parts[0]
    if isinstance(node, ast.Subscript) and getattr(node.value, "id", "") == "Union":
        elts = node.slice.elts if isinstance(node.slice, ast.Tuple) else [node.slice]
        parts = [p for p in elts if not (isinstance(p, ast.Constant) and p.value is None)]
        if len(parts) == 1:
            return parts[0]
    return node


def _field_nargs(st: ast.stmt) -> dict[str, str]:
    """nargs of a dataclass field's options, in ``add_cli_args_from_dataclass``'s order of cases:
    a custom action, ``Literal`` (one value), ``list``, ``bool`` (``store_true``), a scalar."""
    names = list(_field_flags(st))
    if not names:
        return {}
    ann = st.annotation
    raw = ann.slice.elts[0]
    arg = next(
        (
            m
            for m in ann.slice.elts[1:]
            if isinstance(m, ast.Call) and getattr(m.func, "id", "") == "Arg"
        ),
        None,
    )
    kw = {k.arg: k.value for k in arg.keywords} if arg is not None else {}
    if "action" in kw:
        if _action_name(kw["action"]) == "BooleanOptionalAction":
            return {n: "0" for n in names}  # _field_flags listed the negations already
        nargs = _ABSENT
        if isinstance(kw.get("action_kwargs"), ast.Dict):
            for k, v in zip(kw["action_kwargs"].keys, kw["action_kwargs"].values):
                if isinstance(k, ast.Constant) and k.value == "nargs":
                    nargs = v
        return _nargs_of(names, kw["action"], nargs)
    inner = _unwrap(raw)
    head = getattr(inner.value, "id", "") if isinstance(inner, ast.Subscript) else ""
    if head == "Literal":
        return {}
    if head in ("List", "list") and "type_parser" not in kw:
        value = ast.literal_eval(kw["nargs"]) if "nargs" in kw else "+"
        return {n: value for n in names}
    if isinstance(inner, ast.Name) and inner.id == "bool":
        return {n: "0" for n in names}
    if "nargs" in kw:
        return _nargs_of(names, None, kw["nargs"])
    return {}
