"""fmha's flash-attn functions have flash-attn's signatures: the same parameter names, kinds and defaults in
the same order, so that any call written for flash-attn binds the same way. fmha may only append
keyword-only parameters with defaults (FA3's fp8 descales, its kv-cache options).

flash-attn's side is a vendored description, flash_attn_signatures.json (names, kinds, defaults, in order;
the flash-attn version and source it came from), not an import of flash-attn. This file extracts it from
a flash-attn checkout, for every function flash_attn/__init__.py exports from flash_attn_interface:

    python3 tests/python/test_signatures.py PATH/TO/flash-attention v2.8.3.post1 \\
        > tests/python/flash_attn_signatures.json

fmha's side is read twice: from its source with ast (no PyTorch needed: the wheel stage of
scripts/test.sh runs these tests in a venv without PyTorch), and, where PyTorch is installed, with
inspect.signature of what the fmha package exports.
"""

import ast
import importlib.util
import inspect
import json
import os
import sys

import pytest

VENDORED = os.path.join(os.path.dirname(os.path.abspath(__file__)), "flash_attn_signatures.json")


def _row(name, kind, default=None):
    """One parameter: ``default`` is the repr of the default value (absent: no default)."""
    row = {"name": name, "kind": kind}
    if default is not None:
        row["default"] = default
    return row


def _default_repr(node):
    """repr() of a literal default (what inspect shows for the object too), else its source text."""
    text = ast.unparse(node)
    try:
        return repr(ast.literal_eval(text))
    except ValueError:
        return text


def signature_from_ast(fn: ast.FunctionDef) -> list:
    a = fn.args
    positional = [(p, "POSITIONAL_ONLY") for p in a.posonlyargs] + [(p, "POSITIONAL_OR_KEYWORD") for p in a.args]
    defaults = [None] * (len(positional) - len(a.defaults)) + list(a.defaults)
    rows = [_row(p.arg, kind, d and _default_repr(d)) for (p, kind), d in zip(positional, defaults)]
    if a.vararg:
        rows.append(_row(a.vararg.arg, "VAR_POSITIONAL"))
    rows += [_row(p.arg, "KEYWORD_ONLY", d and _default_repr(d)) for p, d in zip(a.kwonlyargs, a.kw_defaults)]
    if a.kwarg:
        rows.append(_row(a.kwarg.arg, "VAR_KEYWORD"))
    return rows


def signature_from_object(fn) -> list:
    return [
        _row(p.name, p.kind.name, None if p.default is inspect.Parameter.empty else repr(p.default))
        for p in inspect.signature(fn).parameters.values()
    ]


def mismatches(fmha_rows, flash_rows) -> list:
    """Why a call written for flash-attn would bind differently to fmha's parameters (empty: it would not)."""
    problems = []
    for i, (ours, theirs) in enumerate(zip(fmha_rows, flash_rows)):
        if ours != theirs:
            problems.append(f"parameter {i}: fmha has {ours}, flash-attn {theirs}")
    if len(fmha_rows) < len(flash_rows):
        problems.append(f"fmha lacks flash-attn's {[r['name'] for r in flash_rows[len(fmha_rows):]]}")
    for row in fmha_rows[len(flash_rows):]:
        if row["kind"] != "KEYWORD_ONLY" or "default" not in row:
            problems.append(f"fmha's own parameter {row} must be keyword-only with a default")
    return problems


def _vendored():
    with open(VENDORED) as f:
        return json.load(f)


FLASH_ATTN = _vendored()


def _fmha_source():
    """fmha's package folder as Python would import it (found, not imported), its modules' top-level
    functions by name and its ``__all__``."""
    folder = importlib.util.find_spec("fmha").submodule_search_locations[0]
    functions, exported = {}, None
    for name in sorted(os.listdir(folder)):
        if not name.endswith(".py"):
            continue
        with open(os.path.join(folder, name)) as f:
            tree = ast.parse(f.read(), name)
        for node in tree.body:
            if isinstance(node, ast.FunctionDef):
                functions.setdefault(node.name, []).append((name, node))
            elif name == "__init__.py" and isinstance(node, ast.Assign) and ast.unparse(node.targets[0]) == "__all__":
                exported = ast.literal_eval(node.value)
    return folder, functions, exported


def test_vendored_description():
    """The description covers flash-attn 2's whole public API (flash_attn/__init__.py's exports)."""
    assert FLASH_ATTN["flash_attn_version"].startswith("2.")
    assert FLASH_ATTN["source"].startswith("https://github.com/Dao-AILab/flash-attention/blob/")
    assert sorted(FLASH_ATTN["functions"]) == [
        "flash_attn_func",
        "flash_attn_kvpacked_func",
        "flash_attn_qkvpacked_func",
        "flash_attn_varlen_func",
        "flash_attn_varlen_kvpacked_func",
        "flash_attn_varlen_qkvpacked_func",
        "flash_attn_with_kvcache",
    ]


@pytest.mark.parametrize("name", sorted(FLASH_ATTN["functions"]))
def test_source_signature_matches_flash_attn(name):
    folder, functions, exported = _fmha_source()
    assert exported is not None and name in exported, f"{name} is not in {folder}/__init__.py's __all__"
    defs = functions.get(name, [])
    assert len(defs) == 1, f"{name}: {len(defs)} top-level definitions in {folder} ({[f for f, _ in defs]})"
    problems = mismatches(signature_from_ast(defs[0][1]), FLASH_ATTN["functions"][name])
    assert not problems, f"{name} ({defs[0][0]}) differs from flash-attn {FLASH_ATTN['flash_attn_version']}: {problems}"


@pytest.mark.parametrize("name", sorted(FLASH_ATTN["functions"]))
def test_exported_signature_matches_flash_attn(name):
    """What ``fmha.<name>`` really is (a decorator or a re-export would show here, not in the source)."""
    pytest.importorskip("torch")
    import fmha

    problems = mismatches(signature_from_object(getattr(fmha, name)), FLASH_ATTN["functions"][name])
    assert not problems, f"fmha.{name} differs from flash-attn {FLASH_ATTN['flash_attn_version']}: {problems}"


def test_mismatches_catches_what_changes_a_call():
    """The comparison itself: order, names, kinds, defaults, missing parameters and positional extras."""
    base = [_row("q", "POSITIONAL_OR_KEYWORD"), _row("dropout_p", "POSITIONAL_OR_KEYWORD", "0.0"),
            _row("causal", "POSITIONAL_OR_KEYWORD", "False")]
    assert mismatches(base, base) == []
    assert mismatches(base + [_row("q_descale", "KEYWORD_ONLY", "None")], base) == []
    assert mismatches([base[0], base[2], base[1]], base)
    assert mismatches([base[0], _row("dropout", "POSITIONAL_OR_KEYWORD", "0.0"), base[2]], base)
    assert mismatches([base[0], _row("dropout_p", "KEYWORD_ONLY", "0.0"), base[2]], base)
    assert mismatches([base[0], _row("dropout_p", "POSITIONAL_OR_KEYWORD", "0"), base[2]], base)
    assert mismatches([base[0], _row("dropout_p", "POSITIONAL_OR_KEYWORD"), base[2]], base)
    assert mismatches(base[:2], base)
    assert mismatches(base + [_row("extra", "POSITIONAL_OR_KEYWORD", "None")], base)
    assert mismatches(base + [_row("extra", "KEYWORD_ONLY")], base)
    assert mismatches(base + [_row("kwargs", "VAR_KEYWORD")], base)
    fn = ast.parse("def f(q, dropout_p=0.0, causal=False, *, window=(-1, -1)): pass").body[0]
    assert signature_from_ast(fn) == base + [_row("window", "KEYWORD_ONLY", "(-1, -1)")]


def vendor(checkout, ref):
    """The description of flash-attn's public functions in ``checkout`` (a flash-attention source tree at
    git ``ref``)."""
    package = os.path.join(checkout, "flash_attn")
    with open(os.path.join(package, "__init__.py")) as f:
        init = ast.parse(f.read())
    with open(os.path.join(package, "flash_attn_interface.py")) as f:
        interface = {n.name: n for n in ast.parse(f.read()).body if isinstance(n, ast.FunctionDef)}
    version = next(
        ast.literal_eval(n.value)
        for n in init.body
        if isinstance(n, ast.Assign) and ast.unparse(n.targets[0]) == "__version__"
    )
    names = [
        alias.name
        for n in init.body
        if isinstance(n, ast.ImportFrom) and n.module == "flash_attn.flash_attn_interface"
        for alias in n.names
    ]
    return {
        "flash_attn_version": version,
        "source": f"https://github.com/Dao-AILab/flash-attention/blob/{ref}/flash_attn/flash_attn_interface.py",
        "note": "parameters in order: name, inspect kind, repr of the default (absent: none); written by "
        "tests/python/test_signatures.py",
        "functions": {name: signature_from_ast(interface[name]) for name in names},
    }


if __name__ == "__main__":
    if len(sys.argv) != 3:
        sys.exit("usage: test_signatures.py FLASH_ATTENTION_CHECKOUT GIT_REF > flash_attn_signatures.json")
    json.dump(vendor(sys.argv[1], sys.argv[2]), sys.stdout, indent=1)
    sys.stdout.write("\n")
